"""The RoPE rotation against its formula ``x * cos + rotate_half(x) * sin``, fp32 and bf16."""

import torch

from transformer.kernels.rotary import apply_rotary
from transformer.modules.positions import RotaryEmbedding


def test_apply_rotary_equals_the_textbook_formula_values_and_gradient():
    """The one-rotation autograd function = x * cos + rotate_half(x) * sin, forward and backward."""
    torch.manual_seed(0)
    rope = RotaryEmbedding(head_dim=8)
    positions = torch.tensor([[0, 1, 2, 5, 9], [3, 4, 5, 6, 7]])
    cos, sin = rope.rotary(positions)
    x = torch.randn(2, 3, 5, 8, requires_grad=True)

    def formula(t):
        t1, t2 = t.chunk(2, dim=-1)
        return t * cos + torch.cat((-t2, t1), dim=-1) * sin

    g = torch.randn(2, 3, 5, 8)
    got, want = apply_rotary(x, cos, sin), formula(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(want, x, g)[0])
    # a rotation keeps the norm of every pair
    torch.testing.assert_close(got.norm(dim=-1), x.norm(dim=-1))


def test_rope_bf16_forward_and_gradients_within_bf16_tolerance_of_fp32():
    torch.manual_seed(2)
    rope = RotaryEmbedding(head_dim=16)
    cos, sin = rope.rotary(torch.arange(9)[None])
    x = torch.randn(2, 4, 9, 16)
    x_low = x.bfloat16().requires_grad_()
    out = apply_rotary(x_low, cos, sin)
    x_ref = x_low.detach().float().requires_grad_()
    ref = apply_rotary(x_ref, cos, sin)
    g = torch.randn_like(ref)
    (gx,) = torch.autograd.grad(out, (x_low,), g.bfloat16())
    (rgx,) = torch.autograd.grad(ref, (x_ref,), g)
    assert out.dtype == gx.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gx.float(), rgx, rtol=1e-2, atol=3e-2)
