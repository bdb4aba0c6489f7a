"""The output layer fused with the label-smoothed loss equals logits + loss, values and gradients."""

import pytest
import torch

import transformer.training.criterion as criterion
from tests.conftest import tiny_model_config
from transformer.models import build_model
from transformer.training.criterion import (
    LabelSmoothedCrossEntropy,
    label_smoothed_nll_loss,
    linear_label_smoothed_nll_loss,
    model_loss,
)

PAD = 0


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk", [4, 1000])
def test_fused_equals_logits_then_loss(eps, chunk, monkeypatch):
    monkeypatch.setattr(criterion, "_chunk_rows", lambda vocab: chunk)
    torch.manual_seed(0)
    hidden = torch.randn(3, 9, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    target = torch.randint(1, 40, (3, 9))
    target[1, 4:] = PAD
    target[2, :3] = PAD
    loss, nll, n = label_smoothed_nll_loss(hidden @ weight.t(), target, eps, PAD)
    ref = torch.autograd.grad(0.5 * loss, (hidden, weight))
    loss2, nll2, n2 = linear_label_smoothed_nll_loss(hidden, weight, target, eps, PAD)
    got = torch.autograd.grad(0.5 * loss2, (hidden, weight))
    assert n == n2 == int((target != PAD).sum())
    torch.testing.assert_close(loss2, loss)
    torch.testing.assert_close(nll2, nll)
    torch.testing.assert_close(got, ref)
    assert got[0][target == PAD].abs().max() == 0  # no gradient at ignored positions


def test_fused_without_grad_and_under_bf16_autocast():
    torch.manual_seed(1)
    hidden, weight = torch.randn(2, 5, 8), torch.randn(30, 8)
    target = torch.randint(1, 30, (2, 5))
    with torch.no_grad():
        loss, nll, _ = linear_label_smoothed_nll_loss(hidden, weight, target, 0.1, PAD)
    ref, ref_nll, _ = label_smoothed_nll_loss(hidden @ weight.t(), target, 0.1, PAD)
    torch.testing.assert_close(loss, ref)
    h = hidden.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, _, _ = linear_label_smoothed_nll_loss(h, weight, target, 0.1, PAD)
    low.backward()
    assert low.dtype == torch.float32 and h.grad.dtype == torch.float32
    torch.testing.assert_close(low, ref, rtol=2e-2, atol=0.5)


def test_fused_shape_and_epsilon_errors():
    with pytest.raises(ValueError):
        linear_label_smoothed_nll_loss(torch.randn(2, 3, 4), torch.randn(5, 4), torch.zeros(2, 4, dtype=torch.long), 0.1, PAD)
    with pytest.raises(ValueError):
        linear_label_smoothed_nll_loss(torch.randn(2, 4), torch.randn(5, 4), torch.zeros(2, dtype=torch.long), 1.0, PAD)


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
def test_model_loss_fused_path_equals_forward_path(arch):
    torch.manual_seed(0)
    model = build_model(tiny_model_config(arch=arch, dropout=0.0), 50).eval()
    crit = LabelSmoothedCrossEntropy(0.1, ignore_index=PAD)
    tokens = torch.randint(5, 50, (3, 7))
    target = torch.randint(5, 50, (3, 7))
    target[0, 5:] = PAD
    if arch == "encoder_decoder":
        net_input = {"src_tokens": torch.randint(5, 50, (3, 6)), "prev_output_tokens": tokens}
    else:
        net_input = {"tokens": tokens}
        target[:, :3] = PAD  # no loss over the source
    torch.testing.assert_close(model.output_proj(model.features(**net_input)), model(**net_input))
    fused = model_loss(model, crit, net_input, target)
    g_fused = torch.autograd.grad(fused["loss"], list(model.parameters()))
    plain = model_loss(model, crit, net_input, target, forward=model)
    g_plain = torch.autograd.grad(plain["loss"], list(model.parameters()))
    torch.testing.assert_close(fused["loss"], plain["loss"])
    torch.testing.assert_close(fused["nll_loss"], plain["nll_loss"])
    assert fused["ntokens"] == plain["ntokens"]
    torch.testing.assert_close(g_fused, g_plain)


def test_compiled_features_equal_eager_without_graph_breaks():
    """``train.compile``: the compiled layers (one graph, padded source) + fused loss = eager."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = build_model(tiny_model_config(n_encoder_layers=1, n_decoder_layers=1, d_model=16, d_ff=32), 40).eval()
    crit = LabelSmoothedCrossEntropy(0.1, ignore_index=PAD)
    src = torch.randint(5, 40, (3, 6))
    src[1, 4:] = PAD  # padded source: the cross-attention mask path
    net_input = {"src_tokens": src, "prev_output_tokens": torch.randint(5, 40, (3, 5))}
    target = torch.randint(5, 40, (3, 5))
    target[2, 3:] = PAD
    compiled = torch.compile(model.features, fullgraph=True)  # fails on any graph break
    got = model_loss(model, crit, net_input, target, features=compiled)
    g_got = torch.autograd.grad(got["loss"], list(model.parameters()))
    ref = model_loss(model, crit, net_input, target)
    g_ref = torch.autograd.grad(ref["loss"], list(model.parameters()))
    torch.testing.assert_close(got["loss"], ref["loss"])
    torch.testing.assert_close(g_got, g_ref)


def test_fused_bf16_autocast_gradients_within_bf16_tolerance_of_fp32():
    """bf16 matmuls, fp32 softmax/loss and fp32 weight gradient: close to the fp32 reference."""
    torch.manual_seed(2)
    hidden, weight = torch.randn(40, 16), torch.randn(300, 16) * 0.3
    target = torch.randint(1, 300, (40,))
    target[-5:] = PAD
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low, low_nll, n = linear_label_smoothed_nll_loss(h, w, target, 0.1, PAD)
    low.backward()
    h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    ref, ref_nll, n_ref = label_smoothed_nll_loss(h_ref @ w_ref.t(), target, 0.1, PAD)
    ref.backward()
    assert n == n_ref == 35 and low.dtype == low_nll.dtype == torch.float32
    assert h.grad.dtype == w.grad.dtype == torch.float32
    torch.testing.assert_close(low, ref, rtol=1e-2, atol=0.0)
    torch.testing.assert_close(low_nll, ref_nll, rtol=1e-2, atol=0.0)
    torch.testing.assert_close(h.grad, h_ref.grad, rtol=0.0, atol=2e-2)
    torch.testing.assert_close(w.grad, w_ref.grad, rtol=0.0, atol=2e-2)
