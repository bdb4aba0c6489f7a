"""The RMSNorm kernel against its formula ``x / sqrt(mean(x^2) + eps) * weight``: values and both
gradients, in fp32 and with bf16 inputs."""

import pytest
import torch

from transformer.kernels.rms_norm import rms_norm
from transformer.modules.norms import RMSNorm


@pytest.mark.parametrize("shape", [(5, 16), (3, 7, 16)])
@pytest.mark.parametrize("eps", [1e-6, 1e-5, 0.0])
def test_rms_norm_equals_the_textbook_formula_values_and_gradients(shape, eps):
    torch.manual_seed(0)
    x = torch.randn(shape, requires_grad=True)
    weight = torch.empty(16).uniform_(0.5, 1.5).requires_grad_()
    g = torch.randn(shape)
    got = rms_norm(x, weight, eps)
    want = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, (x, weight), g), torch.autograd.grad(want, (x, weight), g))


def test_bf16_autocast_forward_and_gradients_match_fp32():
    """Under bf16 autocast the fp32 residual stream keeps the fast fp32 kernel: equal to fp32."""
    torch.manual_seed(0)
    norm = RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(4, 7, 32, requires_grad=True)
    g = torch.randn(4, 7, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = norm(x)
    gx, gw = torch.autograd.grad(out, (x, norm.weight), g)
    ref = torch.nn.RMSNorm(32, eps=1e-5)
    ref.load_state_dict(norm.state_dict())
    x_ref = x.detach().requires_grad_()
    ref_out = ref(x_ref)
    rgx, rgw = torch.autograd.grad(ref_out, (x_ref, ref.weight), g)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(gx, rgx)
    torch.testing.assert_close(gw, rgw)


def test_bf16_input_gradients_within_bf16_tolerance_of_fp32():
    torch.manual_seed(1)
    norm = RMSNorm(32, eps=1e-5)
    x = torch.randn(4, 7, 32)
    x_low = x.bfloat16().requires_grad_()
    out = norm(x_low)
    assert out.dtype == torch.bfloat16
    (gx,) = torch.autograd.grad(out.float().square().sum(), (x_low,))
    x_ref = x_low.detach().float().requires_grad_()
    ref = norm(x_ref)
    (rgx,) = torch.autograd.grad(ref.square().sum(), (x_ref,))
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gx.float(), rgx, rtol=2e-2, atol=2e-2)
