"""Activation checkpointing, the single-process engine, and the train.distributed switch.

The multi-process equalities (DDP and FSDP2 with 2 gloo ranks = 1 rank with doubled update_freq,
FSDP2 checkpoints and resume) are in tests/training/loop/test_trainer.py, since they run scripts/train.py
under torchrun.
"""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import tiny_model_config
from transformer.config import ConfigError, validate_config
from transformer.data.collate import collate_decoder_only, collate_encoder_decoder
from transformer.generation.translate import translate_sentences
from transformer.models import build_model
from transformer.training.distributed.parallel import DataParallel, TrainingLoss, checkpoint_layers, transformer_layers
from transformer.training.distributed.process_group import DistInfo
from transformer.training.step.criterion import LabelSmoothedCrossEntropy, model_loss

VOCAB = 60
ARCHS = {
    "encoder_decoder": dict(dropout=0.2),
    "decoder_only": dict(
        arch="decoder_only",
        n_encoder_layers=1,
        n_decoder_layers=3,
        dropout=0.2,
        norm_position="pre",
        position__name="rope",
    ),
}


def _batch(arch: str):
    g = torch.Generator().manual_seed(5)
    src = [torch.randint(5, VOCAB, (n,), generator=g).tolist() for n in (7, 3, 9, 5)]
    tgt = [torch.randint(5, VOCAB, (n,), generator=g).tolist() for n in (6, 8, 2, 5)]
    return (collate_encoder_decoder if arch == "encoder_decoder" else collate_decoder_only)(src, tgt)


def _grads_and_saved_bytes(model, batch):
    """Gradients of the summed label-smoothed loss, and the bytes autograd saved for backward."""
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    model.zero_grad(set_to_none=True)
    torch.manual_seed(11)  # the same dropout masks for both models
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = model_loss(model, LabelSmoothedCrossEntropy(0.1, ignore_index=0), batch.net_input, batch.target)
    out["loss"].backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, sum(saved)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_activation_checkpointing_gives_equal_gradients_and_saves_less(arch):
    model = build_model(tiny_model_config(**ARCHS[arch]), VOCAB)
    checkpointed = copy.deepcopy(model)
    n_layers = checkpoint_layers(checkpointed)
    assert n_layers == len(transformer_layers(model)) == 4
    assert list(checkpointed.state_dict()) == list(model.state_dict())  # names unchanged (checkpoints load)
    batch = _batch(arch)
    ref, ref_saved = _grads_and_saved_bytes(model, batch)
    got, got_saved = _grads_and_saved_bytes(checkpointed, batch)
    assert ref.keys() == got.keys() and len(ref) == len(list(model.parameters()))
    for name in ref:  # dropout replayed with the same RNG state: the same numbers
        torch.testing.assert_close(got[name], ref[name], rtol=0, atol=0, msg=name)
    assert got_saved < 0.6 * ref_saved  # layer inputs only, activations recomputed
    # decoding (no grad, KV caches) is unaffected
    model.eval()
    checkpointed.eval()
    cfg = {"strategy": "beam", "beam_size": 2, "max_len_a": 1.0, "max_len_b": 4}
    src = [batch.src_tokens[i][batch.src_tokens[i] != 0].tolist() for i in range(2)]
    a = translate_sentences(model, src, cfg, "cpu")
    b = translate_sentences(checkpointed, src, cfg, "cpu")
    assert [h[0].tokens for h in a] == [h[0].tokens for h in b]


def test_single_process_engine_is_the_bare_model():
    model = build_model(tiny_model_config(), VOCAB)
    loss = TrainingLoss(model, LabelSmoothedCrossEntropy(0.1, ignore_index=0))
    par = DataParallel(loss, "none", DistInfo(0, 1, torch.device("cpu")))
    assert par.mode == "none" and par.engine is loss and par.model is model
    batch = _batch("encoder_decoder")
    with par.accumulate(last=False):
        out = par(batch.net_input, batch.target)
    assert out["ntokens"] == batch.ntokens and par.sum_over_ranks(7) == 7 and par.loss_scale(8) == 1 / 8
    assert par.full_state_dict().keys() == model.state_dict().keys()
    with pytest.raises(ValueError, match="train.distributed='zero3' is not one of ddp, fsdp"):
        DataParallel(loss, "zero3", DistInfo(0, 1, torch.device("cpu")))
    with pytest.raises(ValueError, match="train.distributed=ddp needs a process group"):
        DataParallel(loss, "ddp", DistInfo(0, 1, torch.device("cpu")))  # the mode is taken as given


def test_a_one_rank_ddp_engine_is_allowed_and_averages_the_scaled_loss():
    """``ddp`` over a 1-rank process group (what the GPU check measures DDP's own cost with): the
    engine is DDP's, and the loss scaled by :meth:`DataParallel.loss_scale` gives the gradients of
    the summed loss divided by the token count, as the bare model's (DDP averages over 1 rank)."""
    import torch.distributed as dist

    model = build_model(tiny_model_config(), VOCAB)
    ref = build_model(tiny_model_config(), VOCAB)
    ref.load_state_dict(model.state_dict())
    batch = _batch("encoder_decoder")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        par = DataParallel(
            TrainingLoss(model, LabelSmoothedCrossEntropy(0.1, ignore_index=0)),
            "ddp",
            DistInfo(0, 1, torch.device("cpu")),
        )
        assert isinstance(par.engine, torch.nn.parallel.DistributedDataParallel) and par.mode == "ddp"
        with par.accumulate(last=True):
            (par(batch.net_input, batch.target)["loss"] * par.loss_scale(batch.ntokens)).backward()
        par.release()
    finally:
        dist.destroy_process_group()
    out = TrainingLoss(ref, LabelSmoothedCrossEntropy(0.1, ignore_index=0))(batch.net_input, batch.target)
    (out["loss"] / batch.ntokens).backward()
    for (name, a), b in zip(ref.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-6, atol=1e-7, msg=name)


def test_distributed_switch_is_validated():
    from hydra import compose, initialize_config_dir

    from tests.conftest import REPO_ROOT
    from transformer.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        ok = compose(config_name="train", overrides=["train.distributed=fsdp", "train.activation_checkpointing=true"])
        bad = compose(config_name="train", overrides=["train.distributed=zero3"])
        fp16 = compose(config_name="train", overrides=["train.distributed=fsdp", "train.precision=fp16"])
        ema = compose(config_name="train", overrides=["train.distributed=fsdp", "train.ema_decay=0.999"])
    validate_config(ok)
    with pytest.raises(ConfigError, match="train.distributed='zero3' is not one of ddp, fsdp"):
        validate_config(bad)
    with pytest.raises(ConfigError, match="train.distributed=fsdp does not support train.precision=fp16"):
        validate_config(fp16)
    with pytest.raises(ConfigError, match="train.ema_decay > 0 with train.distributed=fsdp"):
        validate_config(ema)
