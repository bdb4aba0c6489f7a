"""bf16 training runs: the loss falls as in fp32, and a resume is exact."""

import json

import torch

from tests.training.conftest import small_config
from transformer.training.checkpoint import load_checkpoint
from transformer.training.job.run import train


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
