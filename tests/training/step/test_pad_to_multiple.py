"""train.pad_to_multiple: the extra padding of bounded batch shapes enters no loss, token count or
MoE statistic (the trainer's loss path, both families, dense and mixture of experts), and the run
reports its batch shapes at start."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_model_config
from transformer.data.collate import collate_decoder_only, collate_encoder_decoder
from transformer.models import build_model
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, model_loss

SRC = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18]]
TGT = [[20, 21, 22], [23, 24, 25, 26, 27, 28], [29]]


@pytest.mark.parametrize("arch", ["encoder_decoder", "decoder_only"])
@pytest.mark.parametrize("ffn", ["swiglu", "moe"])
def test_the_loss_of_a_batch_does_not_see_the_extra_padding(arch, ffn):
    cfg = tiny_model_config(
        arch=arch,
        **{"ffn.name": ffn, "ffn.n_experts": 4, "ffn.top_k": 2},
        **({"n_encoder_layers": 0} if arch == "decoder_only" else {}),
    )
    torch.manual_seed(0)
    model = build_model(cfg, 40).train()
    criterion = LabelSmoothedCrossEntropy(0.1, ignore_index=0)
    collate = collate_encoder_decoder if arch == "encoder_decoder" else collate_decoder_only
    out = {}
    for m in (1, 8):
        batch = collate(SRC, TGT, pad_to_multiple=m)
        assert all(t.shape[1] % m == 0 for t in batch.net_input.values())
        torch.manual_seed(1)
        out[m] = model_loss(model, criterion, batch.net_input, batch.target)
        out[m]["ntokens_batch"] = batch.ntokens
    assert out[1]["ntokens_batch"] == out[8]["ntokens_batch"] == sum(len(t) + 1 for t in TGT)
    for key in (
        "loss",
        "nll_loss",
        "ntokens",
        *(("router_loss", "moe_aux_loss", "moe_z_loss", "moe_load") if ffn == "moe" else ()),
    ):
        torch.testing.assert_close(
            torch.as_tensor(out[8][key]).float(), torch.as_tensor(out[1][key]).float(), atol=1e-5, rtol=1e-5, msg=key
        )


@pytest.mark.parametrize(
    "device,precision,expected",
    [("cpu", "fp32", 1), ("cpu", "bf16", 1), ("cuda", "bf16", 8), ("cuda", "fp32", 8), ("mps", "fp32", 8)],
)
def test_auto_takes_the_measured_multiple_of_the_device_and_precision(device, precision, expected):
    from transformer.data.batching import AUTO_PAD_TO_MULTIPLE, resolve_pad_to_multiple

    assert resolve_pad_to_multiple("auto", device, precision) == expected
    assert AUTO_PAD_TO_MULTIPLE.get((device, precision), 8) == expected
    assert resolve_pad_to_multiple(16, device, precision) == 16  # a number is kept


@pytest.mark.parametrize("value", [0, -8, "eight", True, 2.5])
def test_a_pad_to_multiple_that_is_neither_auto_nor_a_positive_integer_is_refused_by_name(value):
    from transformer.config import ConfigError, typed_config, validate_config
    from transformer.data.batching import resolve_pad_to_multiple

    cfg = typed_config({"train": {"pad_to_multiple": value}})
    with pytest.raises(ConfigError, match=r"train.pad_to_multiple=.* must be auto or an integer >= 1"):
        validate_config(cfg)
    with pytest.raises(ValueError, match="must be auto or an integer >= 1"):
        resolve_pad_to_multiple(value, "cpu", "fp32")


def test_a_multiple_past_max_tokens_or_max_positions_is_refused_by_name():
    from transformer.config import ConfigError, typed_config, validate_config

    for fields, words in (
        ({"train": {"pad_to_multiple": 8192}}, "train.max_tokens=4096"),
        ({"train": {"pad_to_multiple": 512}, "model": {"max_positions": 256}}, "model.max_positions=256"),
    ):
        with pytest.raises(ConfigError, match=rf"train.pad_to_multiple=\d+ rounds every length past .*{words}"):
            validate_config(typed_config(fields))


def test_a_run_with_a_chosen_multiple_resumes_without_naming_it_again(tmp_path):
    """The command line's default (auto) on a resume is not a change: the run keeps its own number,
    whatever auto would resolve to here (scripts/train.py, Hydra's view of what the command line named)."""
    import json
    import subprocess
    import sys

    from omegaconf import OmegaConf

    from tests.conftest import REPO_ROOT, multi30k_excerpt, parallel_text_args

    corpus = multi30k_excerpt(tmp_path / "corpus", {"train": 120, "val": 8, "test_2016_flickr": 4})
    run = tmp_path / "run"
    tiny = [
        *parallel_text_args(corpus, 150),
        "model.n_encoder_layers=1",
        "model.n_decoder_layers=1",
        "model.d_model=32",
        "model.n_heads=4",
        "model.d_ff=64",
        "train.max_tokens=300",
        "train.max_time=0",
        "train.validate_every=100",
        "train.valid_bleu=false",
        "train.progress=false",
        "train.num_threads=1",
        "train.precision=fp32",
        "lr_scheduler.warmup_updates=1",
        "generation.beam_size=1",
        "generation.max_len_b=3",
        f"hydra.run.dir={run}",
    ]

    def train(*extra: str) -> None:
        out = subprocess.run(
            [sys.executable, str(REPO_ROOT / "scripts" / "train.py"), *tiny, *extra],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-3000:]

    train("train.max_updates=1", "train.pad_to_multiple=8")
    train("train.max_updates=2", "train.resume=true")  # auto here would be 1 on this CPU
    assert OmegaConf.load(run / "config.yaml").train.pad_to_multiple == 8
    assert json.loads((run / "results.json").read_text())["updates"] == 2
