"""Activation checkpointing, the single-process engine, and the train.distributed switch.

The multi-process equalities (DDP and FSDP2 with 2 gloo ranks = 1 rank with doubled update_freq,
FSDP2 checkpoints and resume) are in tests/training/test_trainer.py, since they run scripts/train.py
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
    par = DataParallel(loss, "fsdp", DistInfo(0, 1, torch.device("cpu")))
    assert par.mode == "none" and par.engine is loss and par.model is model
    batch = _batch("encoder_decoder")
    with par.accumulate(last=False):
        out = par(batch.net_input, batch.target)
    assert out["ntokens"] == batch.ntokens and par.global_sums(7, 1.5) == (7, 1.5)
    assert par.full_state_dict().keys() == model.state_dict().keys()
    with pytest.raises(ValueError, match="train.distributed='zero3' is not one of ddp, fsdp"):
        DataParallel(loss, "zero3", DistInfo(0, 1, torch.device("cpu")))


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


def test_gradient_division_is_one_multi_tensor_kernel_equal_by_value():
    """``DataParallel.normalise`` divides every gradient by the token count (a host int or a device
    count) in one ``_foreach_div_``, with the same numbers as a division per parameter."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    model = build_model(tiny_model_config(), VOCAB)
    parallel = DataParallel(TrainingLoss(model, None), "ddp", DistInfo(0, 1, torch.device("cpu")))
    for ntokens in (37, torch.tensor(37)):
        g = torch.Generator().manual_seed(3)
        params = [p for p in model.parameters()]
        grads = [torch.randn(p.shape, generator=g) for p in params]
        for p, grad in zip(params, grads):
            p.grad = grad.clone()
        with Ops() as ops:
            parallel.normalise(params, ntokens)
        assert ops.names.count("_foreach_div_") == 1 and "div_" not in ops.names, ops.names
        for p, grad in zip(params, grads):
            torch.testing.assert_close(p.grad, grad.div_(37), rtol=0, atol=0)
