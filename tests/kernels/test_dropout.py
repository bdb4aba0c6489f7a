"""The dropout kernels against inverted dropout ``y = m * x / (1 - p)``, ``m ~ Bernoulli(1 - p)``:
rate, scaling, gradients through the same mask, reproducibility, the fused residual add, bf16."""

import pytest
import torch

from transformer.kernels.dropout import dropout, dropout_add


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_drop_rate_and_inverted_scaling(p):
    torch.manual_seed(0)
    x = torch.rand(1000, 1000) + 0.5  # no zeros, so a zero output means dropped
    y = dropout(x, p, training=True)
    dropped = y == 0
    # 1e6 Bernoulli(p) draws: the standard deviation of the rate is < 5e-4
    assert abs(dropped.float().mean().item() - p) < 3e-3
    torch.testing.assert_close(y[~dropped], x[~dropped] / (1 - p))


def test_gradient_uses_the_forward_mask():
    torch.manual_seed(1)
    x = (torch.rand(64, 32) + 0.5).requires_grad_()
    y = dropout(x, 0.25, training=True)
    y.backward(torch.ones_like(y))
    kept = y.detach() != 0
    torch.testing.assert_close(x.grad, kept.float() / 0.75)


def test_dropout_add_values_and_gradients():
    torch.manual_seed(2)
    residual = torch.randn(8, 6, 16, requires_grad=True)
    x = (torch.rand(8, 6, 16) + 0.5).requires_grad_()
    out = dropout_add(residual, x, 0.3, training=True)
    delta = (out - residual).detach()
    kept = delta != 0
    torch.testing.assert_close(delta[kept], x.detach()[kept] / 0.7)
    g = torch.randn_like(out)
    out.backward(g)
    torch.testing.assert_close(residual.grad, g)
    torch.testing.assert_close(x.grad, g * kept / 0.7)


def test_reproducible_under_manual_seed():
    x = torch.randn(32, 32)
    torch.manual_seed(3)
    a = dropout(x, 0.3, training=True)
    torch.manual_seed(3)
    b = dropout(x, 0.3, training=True)
    assert torch.equal(a, b)


def test_bf16_uses_the_fast_mask_and_matches_fp32():
    # bf16 draws the same int32 mask as fp32 (no bernoulli_ fallback): same seed, same zeros
    x = torch.randn(64, 32)
    torch.manual_seed(4)
    ref = dropout(x, 0.2, training=True)
    torch.manual_seed(4)
    low = dropout(x.bfloat16(), 0.2, training=True)
    assert low.dtype == torch.bfloat16
    assert torch.equal(low == 0, ref == 0)
    torch.testing.assert_close(low.float(), ref, rtol=8e-3, atol=1e-2)  # bf16 rounding


def test_bf16_sublayer_into_fp32_residual_matches_fp32_with_gradients():
    """The autocast case: bf16 sublayer output + fp32 residual, fast mask, fp32 sum, grads by dtype."""
    residual = torch.randn(16, 24, 32, requires_grad=True)
    x = torch.randn(16, 24, 32)
    x_low = x.bfloat16().requires_grad_()
    x_ref = x_low.detach().float().requires_grad_()
    torch.manual_seed(5)
    out = dropout_add(residual, x_low, 0.3, training=True)
    torch.manual_seed(5)
    ref = dropout_add(residual.detach().requires_grad_(), x_ref, 0.3, training=True)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=8e-3, atol=1e-2)
    g = torch.randn_like(out)
    grad_x, grad_res = torch.autograd.grad(out, (x_low, residual), g)
    (grad_x_ref,) = torch.autograd.grad(ref, (x_ref,), g)
    assert grad_x.dtype == torch.bfloat16 and grad_res.dtype == torch.float32
    torch.testing.assert_close(grad_x.float(), grad_x_ref, rtol=8e-3, atol=1e-2)
    torch.testing.assert_close(grad_res, g)


def test_under_torch_compile_dropout_traces_whole_and_still_drops():
    """The in-place ``random_`` of the CPU mask is a graph break: compiled, the framework's dropout
    runs instead, so a training step with dropout compiles as one graph."""
    residual, x = torch.randn(64, 48), torch.randn(64, 48)
    fn = torch.compile(lambda r, y: dropout_add(r, dropout(y, 0.25, True), 0.25, True), fullgraph=True, backend="eager")
    out = fn(residual, x)  # fullgraph=True raises on a graph break
    dropped = (out == residual).float().mean().item()  # elements whose dropout output was zeroed
    assert 0.35 < dropped < 0.5  # 1 - 0.75^2 = 0.4375 of them
    kept = out != residual
    torch.testing.assert_close(out[kept], (residual + x / 0.75 / 0.75)[kept])


def test_a_training_step_with_dropout_compiles_as_one_graph():
    """The 2017 base preset (post-LN, sinusoidal positions, dropout 0.1) in training mode, tiny
    sizes: forward, fused loss and backward traced by ``fullgraph=True``, under bf16 autocast too."""
    from transformer.config import typed_config
    from transformer.models import build_model
    from transformer.training.step.criterion import LabelSmoothedCrossEntropy, model_loss

    cfg = typed_config(
        {
            "model": {
                "d_model": 32,
                "n_heads": 4,
                "d_ff": 64,
                "n_encoder_layers": 1,
                "n_decoder_layers": 1,
                "dropout": 0.1,
            }
        }
    ).model
    model = build_model(cfg, 60).train()
    criterion = LabelSmoothedCrossEntropy(0.1, ignore_index=0)
    src, prev, tgt = torch.randint(4, 60, (3, 9)), torch.randint(4, 60, (3, 7)), torch.randint(4, 60, (3, 7))

    def step(src, prev, tgt):
        out = model_loss(model, criterion, {"src_tokens": src, "prev_output_tokens": prev}, tgt, None)
        return out["loss"] / out["ntokens"]

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for autocast in (False, True):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = compiled(src, prev, tgt)
        loss.backward()
        assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters() if p.requires_grad)
        model.zero_grad()
