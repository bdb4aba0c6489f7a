"""Label-smoothed cross entropy: hand-computed values, padding, PyTorch and fairseq forms."""

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.training.step.criterion import LabelSmoothedCrossEntropy, label_smoothed_nll_loss, perplexity

PAD = 1


def test_hand_computed_three_classes():
    # logits = log([1, 2, 5]) -> p = [1/8, 2/8, 5/8] for every position.
    # -log p = [ln 8, ln 4, ln 8/5] = [2.0794415, 1.3862944, 0.4700036]; mean over V=3: 1.3119132.
    # eps = 0.1:
    #   target 2: nll = 0.4700036, loss = 0.9 * 0.4700036 + 0.1 * 1.3119132 = 0.5541946
    #   target 0: nll = 2.0794415, loss = 0.9 * 2.0794415 + 0.1 * 1.3119132 = 2.0026887
    #   target PAD (=1): ignored
    logits = torch.log(torch.tensor([1.0, 2.0, 5.0])).repeat(1, 3, 1)  # (1, 3, 3)
    target = torch.tensor([[2, 0, PAD]])
    loss, nll, ntokens = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    assert ntokens == 2
    assert nll.item() == pytest.approx(0.4700036 + 2.0794415, abs=1e-6)
    assert loss.item() == pytest.approx(0.5541946 + 2.0026887, abs=1e-6)
    assert loss.dtype == nll.dtype == torch.float32


def test_matches_torch_cross_entropy():
    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11, requires_grad=True)
    target = torch.randint(0, 11, (3, 7))
    target[0, 5:] = PAD
    target[2, 2:] = PAD
    for eps in (0.0, 0.1, 0.3):
        loss, nll, ntokens = label_smoothed_nll_loss(logits, target, eps, PAD)
        ref = F.cross_entropy(
            logits.reshape(-1, 11), target.reshape(-1), reduction="sum", label_smoothing=eps, ignore_index=PAD
        )
        ref_nll = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), reduction="sum", ignore_index=PAD)
        torch.testing.assert_close(loss, ref)
        torch.testing.assert_close(nll, ref_nll)
        assert ntokens == int((target != PAD).sum())
        (g,) = torch.autograd.grad(loss, logits)
        (g_ref,) = torch.autograd.grad(ref, logits)
        torch.testing.assert_close(g, g_ref)
        assert g[target == PAD].abs().max() == 0


def test_equals_fairseq_form_with_rescaled_epsilon():
    """fairseq spreads eps over the V-1 other classes; ours equals it with eps * (V-1) / V."""
    torch.manual_seed(1)
    V, eps = 9, 0.1
    logits, target = torch.randn(20, V), torch.randint(0, V, (20,))
    lprobs = logits.log_softmax(-1)
    eps_f = eps * (V - 1) / V
    nll = -lprobs.gather(-1, target[:, None]).sum()
    fairseq = (1 - eps_f - eps_f / (V - 1)) * nll + eps_f / (V - 1) * (-lprobs.sum())
    loss, _, _ = label_smoothed_nll_loss(logits, target, eps, ignore_index=-100)
    torch.testing.assert_close(loss, fairseq)


def test_extra_padding_positions_change_nothing():
    torch.manual_seed(2)
    logits, target = torch.randn(2, 5, 13), torch.randint(2, 13, (2, 5))
    base = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    padded_logits = torch.cat([logits, 100 * torch.randn(2, 4, 13)], dim=1)  # (2, 9, 13)
    padded_target = torch.cat([target, torch.full((2, 4), PAD)], dim=1)
    padded = label_smoothed_nll_loss(padded_logits, padded_target, 0.1, PAD)
    torch.testing.assert_close(padded[0], base[0])
    torch.testing.assert_close(padded[1], base[1])
    assert padded[2] == base[2] == 10


def test_flat_input_and_fp32_for_low_precision_logits():
    torch.manual_seed(3)
    logits = torch.randn(6, 10).to(torch.bfloat16)
    target = torch.tensor([0, 2, 3, PAD, 5, 6])
    loss, nll, n = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    ref_loss, ref_nll, _ = label_smoothed_nll_loss(logits.float(), target, 0.1, PAD)
    assert loss.dtype == torch.float32 and n == 5
    torch.testing.assert_close(loss, ref_loss, rtol=0, atol=0)
    torch.testing.assert_close(nll, ref_nll, rtol=0, atol=0)


def test_criterion_class_and_per_token_normalisation_by_caller():
    torch.manual_seed(4)
    crit = LabelSmoothedCrossEntropy(label_smoothing=0.1, ignore_index=PAD)
    logits, target = torch.randn(2, 4, 8), torch.tensor([[2, 3, 4, PAD], [5, PAD, PAD, PAD]])
    out = crit(logits, target)
    assert set(out) == {"loss", "nll_loss", "ntokens"} and out["ntokens"] == 4
    mean = F.cross_entropy(logits.reshape(-1, 8), target.reshape(-1), label_smoothing=0.1, ignore_index=PAD)
    torch.testing.assert_close(out["loss"] / out["ntokens"], mean)


@pytest.mark.parametrize("eps", [-0.1, 1.0])
def test_invalid_epsilon_raises(eps):
    with pytest.raises(ValueError, match="must be in"):
        LabelSmoothedCrossEntropy(eps, PAD)
    with pytest.raises(ValueError, match="must be in"):
        label_smoothed_nll_loss(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), eps, PAD)


def test_shape_mismatch_raises():
    with pytest.raises(ValueError, match="target shape"):
        label_smoothed_nll_loss(torch.zeros(2, 3, 5), torch.zeros(3, 2, dtype=torch.long), 0.1, PAD)


def test_perplexity():
    assert perplexity(0.0) == 1.0
    assert perplexity(math.log(8.0)) == pytest.approx(8.0)
    assert perplexity(1e6) == pytest.approx(math.exp(100))  # capped, no OverflowError
    assert math.isnan(perplexity(float("nan")))
