"""Our RMSNorm equals torch.nn.RMSNorm (values, both gradients) and loads its state dict (the kernel's
formula and bf16 numerics: tests/kernels/test_rms_norm.py)."""

import pytest
import torch

from transformer.modules.norms import RMSNorm


@pytest.mark.parametrize("shape", [(5, 16), (3, 7, 16)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5])
def test_equals_torch_rmsnorm_values_and_gradients(shape, eps):
    torch.manual_seed(0)
    ref = torch.nn.RMSNorm(16, eps=eps)
    with torch.no_grad():
        ref.weight.uniform_(0.5, 1.5)
    ours = RMSNorm(16, eps=eps)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(shape, requires_grad=True)
    g = torch.randn(shape)
    want = ref(x)
    got = ours(x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(
        torch.autograd.grad(got, (x, ours.weight), g), torch.autograd.grad(want, (x, ref.weight), g)
    )


def test_formula_by_value():
    norm = RMSNorm(4, eps=0.0)
    x = torch.tensor([[1.0, -1.0, 1.0, -1.0], [2.0, 0.0, 0.0, 0.0]])
    # mean squares 1 and 1: x / 1, the second row 2 / sqrt(4 / 4) = 2
    torch.testing.assert_close(norm(x), x)
    norm2 = RMSNorm(2, eps=0.0)
    torch.testing.assert_close(norm2(torch.tensor([[3.0, 4.0]])), torch.tensor([[3.0, 4.0]]) / (12.5**0.5))


def test_bf16_input_uses_the_parent_path():
    ours = RMSNorm(8).to(torch.bfloat16)
    x = torch.randn(2, 8, dtype=torch.bfloat16)
    ref = torch.nn.RMSNorm(8, eps=1e-6).to(torch.bfloat16)
    torch.testing.assert_close(ours(x), ref(x))
