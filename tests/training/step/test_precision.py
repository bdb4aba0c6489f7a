"""train.precision=auto: bf16 only where the device multiplies bf16 in hardware (probes mocked)."""

import pytest
import torch

from transformer.training.step import precision as P


@pytest.mark.parametrize(
    "amx,avx512_bf16,expected", [(True, False, "bf16"), (False, True, "bf16"), (False, False, "fp32")]
)
def test_auto_on_cpu_follows_the_bf16_probes(monkeypatch, amx, avx512_bf16, expected):
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    assert P.resolve_precision("auto", torch.device("cpu")) == expected


@pytest.mark.parametrize("capability,expected", [((9, 0), "bf16"), ((8, 0), "bf16"), ((7, 5), "fp32")])
def test_auto_on_cuda_needs_sm80(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert P.resolve_precision("auto", torch.device("cuda", 0)) == expected


def test_explicit_precisions_pass_through_and_unknown_fails():
    for name in ("fp32", "bf16", "fp16"):
        assert P.resolve_precision(name, torch.device("cpu")) == name
    with pytest.raises(ValueError, match="train.precision='half'"):
        P.resolve_precision("half", torch.device("cpu"))


def test_hardware_is_read_from_the_machine():
    info = P.describe_hardware(torch.device("cpu"))
    assert info["cpu"] and info["torch"] == torch.__version__
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["cpu_fast_bf16"] == P.cpu_has_fast_bf16()


# ----------------------------------------------------------------------------- bf16 training runs

import json  # noqa: E402

from tests.training.conftest import small_config  # noqa: E402
from transformer.training.checkpoint import load_checkpoint  # noqa: E402
from transformer.training.job.run import train  # noqa: E402


def _train_losses(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


def test_bf16_loss_falls_like_fp32(small_corpus, tmp_path):
    common = (
        "train.max_updates=12",
        "train.validate_every=0",
        "train.valid_bleu=false",
        "model.dropout=0.0",
        "optim.lr=3e-3",
    )
    train(small_config(small_corpus, tmp_path / "fp32", *common))
    results = train(small_config(small_corpus, tmp_path / "bf16", *common, "train.precision=bf16"))
    fp32, bf16 = _train_losses(tmp_path / "fp32"), _train_losses(tmp_path / "bf16")
    assert results["precision"] == "bf16" and len(fp32) == len(bf16) == 12
    assert bf16[-1] < bf16[0] - 0.5  # it learns
    for a, b in zip(fp32, bf16):  # and follows the fp32 curve step by step
        assert abs(a - b) < 0.02 * a, (fp32, bf16)


def test_bf16_resume_equals_uninterrupted_bit_for_bit(small_corpus, tmp_path):
    full, split = tmp_path / "full", tmp_path / "split"
    train(small_config(small_corpus, full, "train.precision=bf16", "train.max_updates=6"))
    train(small_config(small_corpus, split, "train.precision=bf16", "train.max_updates=3"))
    train(small_config(small_corpus, split, "train.precision=bf16", "train.max_updates=6", "train.resume=true"))
    a, b = load_checkpoint(full, "checkpoint_last")[0], load_checkpoint(split, "checkpoint_last")[0]
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == torch.float32 and torch.equal(a[k], b[k]), k
    assert _train_losses(full) == _train_losses(split)
