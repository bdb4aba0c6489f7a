"""The criterion's fused path: argument checks, and the model loss through it equals logits + loss
(the kernel itself: tests/kernels/test_fused_loss.py)."""

import pytest
import torch

from tests.conftest import tiny_model_config
from transformer.models import build_model
from transformer.training.step.criterion import (
    LabelSmoothedCrossEntropy,
    linear_label_smoothed_nll_loss,
    model_loss,
)

PAD = 0


def test_fused_shape_and_epsilon_errors():
    with pytest.raises(ValueError):
        linear_label_smoothed_nll_loss(
            torch.randn(2, 3, 4), torch.randn(5, 4), torch.zeros(2, 4, dtype=torch.long), 0.1, PAD
        )
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


@pytest.mark.slow
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
