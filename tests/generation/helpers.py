"""Test helpers for decoding: tiny biased models, a no-cache reference model, a table model."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from tests.conftest import tiny_model_config
from transformer.models import build_model

PAD, UNK, BOS, EOS, SEP = 0, 1, 2, 3, 4


def make_model(
    arch: str = "encoder_decoder",
    vocab: int = 40,
    *,
    eos_bias: float = 0.0,
    scale: float = 1.0,
    seed: int = 0,
    **overrides,
) -> nn.Module:
    """A tiny (d 32, 2+2 layers, dropout 0) model whose output layer gets a bias on EOS.

    ``scale`` multiplies the output matrix (peakier distributions); ``eos_bias`` is added to the EOS
    logit so that hypotheses finish at varied lengths. Both families read the same
    ``output_proj`` in their teacher-forced forward and in ``decode_step``.
    """
    torch.manual_seed(seed)
    if arch == "decoder_only":
        overrides = {"arch": "decoder_only", "n_encoder_layers": 0, **overrides}
    model = build_model(tiny_model_config(**overrides), vocab)
    old = model.output_proj
    proj = nn.Linear(old.in_features, old.out_features, bias=True)
    with torch.no_grad():
        proj.weight.copy_(old.weight * scale)
        proj.bias.zero_()
        proj.bias[EOS] = eos_bias
    model.output_proj = proj
    return model.eval()


def make_src(arch: str, lengths: Sequence[int], vocab: int, seed: int = 0) -> Tensor:
    """Right-padded random sources ``(len(lengths), max)`` in the arch's format (+EOS for enc-dec)."""
    g = torch.Generator().manual_seed(seed)
    low = 5 if vocab > 5 else 1  # tiny vocabularies: any non-special-looking id
    seqs = [torch.randint(low, vocab, (n,), generator=g).tolist() for n in lengths]
    if arch == "encoder_decoder":
        seqs = [s + [EOS] for s in seqs]
    width = max(len(s) for s in seqs)
    out = torch.zeros(len(seqs), width, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.tensor(s)
    return out


class _PrefixState:
    """Decoding state of the reference models: the source and every token fed so far."""

    def __init__(self, src: Tensor) -> None:
        self.src = src
        self.prefix = torch.empty(src.shape[0], 0, dtype=torch.long)

    def reorder(self, index: Tensor, host_index=None) -> None:
        self.src = self.src.index_select(0, index)
        self.prefix = self.prefix.index_select(0, index)

    @property
    def batch_size(self) -> int:
        return self.src.shape[0]


def full_logits(model: nn.Module, src: Tensor, prefix: Tensor) -> Tensor:
    """Teacher-forced logits ``(B, T, V)`` at every fed token (``prefix`` starts with the start token)."""
    if model.arch == "encoder_decoder":
        return model(src, prefix)
    lengths = src.ne(model.pad_id).sum(1)
    seqs = [torch.cat((src[i, : lengths[i]], prefix[i])) for i in range(src.shape[0])]
    width = max(len(s) for s in seqs)
    tokens = torch.full((len(seqs), width), model.pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = s
    logits = model(tokens)  # (B, L, V); right padding is invisible to earlier positions (causal)
    t = prefix.shape[1]
    return torch.stack([logits[i, lengths[i] : lengths[i] + t] for i in range(len(seqs))])


class RecomputeModel(nn.Module):
    """The same model decoded without any cache: every step re-runs the teacher-forced forward."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.arch, self.pad_id, self.eos_id = model.arch, model.pad_id, model.eos_id
        self.decoder_start_token_id = model.decoder_start_token_id

    def start_decoding(self, src_tokens: Tensor) -> _PrefixState:
        return _PrefixState(src_tokens)

    def decode_step(self, tokens: Tensor, state: _PrefixState) -> Tensor:
        state.prefix = torch.cat((state.prefix, tokens), dim=1)
        return full_logits(self.model, state.src, state.prefix)[:, -1]


class Recorder(nn.Module):
    """Wraps a model and keeps a copy of every ``decode_step`` output."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.arch, self.pad_id, self.eos_id = model.arch, model.pad_id, model.eos_id
        self.decoder_start_token_id = model.decoder_start_token_id
        self.logits: list[Tensor] = []

    def start_decoding(self, src_tokens: Tensor):
        return self.model.start_decoding(src_tokens)

    def decode_step(self, tokens: Tensor, state) -> Tensor:
        out = self.model.decode_step(tokens, state)
        self.logits.append(out.clone())
        return out


class TableModel(nn.Module):
    """A fake model: ``fn(prefix: tuple[int, ...]) -> list[float]`` gives the log-probabilities.

    ``prefix`` excludes the start token. The source is ignored (only its batch size counts).
    """

    arch = "encoder_decoder"

    def __init__(self, fn: Callable[[tuple[int, ...]], Sequence[float]], pad_id: int = PAD, eos_id: int = EOS) -> None:
        super().__init__()
        self.fn, self.pad_id, self.eos_id, self.decoder_start_token_id = fn, pad_id, eos_id, BOS

    def start_decoding(self, src_tokens: Tensor) -> _PrefixState:
        return _PrefixState(src_tokens)

    def decode_step(self, tokens: Tensor, state: _PrefixState) -> Tensor:
        state.prefix = torch.cat((state.prefix, tokens), dim=1)
        rows = [tuple(r[1:]) for r in state.prefix.tolist()]
        return torch.tensor([list(self.fn(r)) for r in rows], dtype=torch.float32)


def sequence_logprob(model: nn.Module, src: Tensor, tokens: Sequence[int]) -> float:
    """Summed log-probability of ``tokens`` (ending with EOS) for one source ``(1, S)``."""
    prefix = torch.tensor([[model.decoder_start_token_id, *tokens[:-1]]])
    with torch.no_grad():
        lp = torch.log_softmax(full_logits(model, src, prefix).double(), -1)[0]  # (T, V)
    return float(lp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


def enumerate_outputs(vocab: int, max_len: int, min_len: int = 0, banned: Sequence[int] = (PAD,)) -> list[list[int]]:
    """Every output sequence (tokens + EOS) with ``min_len <= len - 1 <= max_len``."""
    allowed = [t for t in range(vocab) if t not in banned and t != EOS]
    return [list(w) + [EOS] for n in range(min_len, max_len + 1) for w in itertools.product(allowed, repeat=n)]


# ----------------------------------------------------------------------------- run folders

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def shared_data_dir():
    """``$TRANSFORMER_DATA_DIR`` when set, else ``<repo>/../shared/data`` (may not exist)."""
    import os
    from pathlib import Path

    env = os.environ.get("TRANSFORMER_DATA_DIR")
    return Path(env) if env else (REPO_ROOT / ".." / "shared" / "data").resolve()


def corpus_lines(n: int = 300) -> dict[str, list[str]]:
    """The first ``n`` Multi30k training lines (en, de), or synthetic lines without the data."""
    from transformer.data.corpus import read_lines

    d = shared_data_dir() / "multi30k"
    if (d / "train.en.gz").is_file():
        return {lang: read_lines(d / f"train.{lang}.gz")[:n] for lang in ("en", "de")}
    words = "a man woman dog runs in the park with two people on street red blue".split()
    g = torch.Generator().manual_seed(0)
    lines = [" ".join(words[i] for i in torch.randint(0, len(words), (8,), generator=g).tolist()) for _ in range(n)]
    return {"en": lines, "de": [line.upper() for line in lines]}


def make_run_dir(
    root, arch: str = "encoder_decoder", vocab_size: int = 250, joint: bool = True, seed: int = 0, **model_overrides
):
    """Write a tiny run folder like training does: config.yaml, spm model(s), checkpoint_best.

    Returns:
        ``(run_dir, model, src_tokenizer, tgt_tokenizer)`` with the model in eval mode.
    """
    from pathlib import Path

    from omegaconf import OmegaConf

    from transformer.config import Config
    from transformer.data.tokenizer import Tokenizer
    from transformer.training.checkpoint import save_checkpoint

    run_dir = Path(root)
    run_dir.mkdir(parents=True, exist_ok=True)
    lines = corpus_lines()
    if joint:
        src_tok = tgt_tok = Tokenizer.train(lines["en"] + lines["de"], run_dir / "spm", vocab_size=vocab_size)
    else:
        src_tok = Tokenizer.train(lines["en"], run_dir / "spm.src", vocab_size=vocab_size)
        tgt_tok = Tokenizer.train(lines["de"], run_dir / "spm.tgt", vocab_size=vocab_size - 20)
    cfg = OmegaConf.structured(Config)
    if arch == "decoder_only":
        model_overrides = {"arch": "decoder_only", "n_encoder_layers": 0, **model_overrides}
    if not joint:
        model_overrides = {"tie_embeddings": "decoder", **model_overrides}
    cfg.model = tiny_model_config(**model_overrides)
    cfg.data.joint_vocab = joint
    cfg.data.root = str(shared_data_dir())
    cfg.generation.max_len_b = 5
    cfg.generation.max_len_a = 1.0
    OmegaConf.save(cfg, run_dir / "config.yaml")
    torch.manual_seed(seed)
    model = build_model(cfg.model, len(src_tok), None if joint else len(tgt_tok))
    with torch.no_grad():  # make EOS likely enough that outputs have varied lengths
        model.output_proj.weight.mul_(2.0)
    save_checkpoint(
        run_dir, "checkpoint_best", model.state_dict(), {"config": OmegaConf.to_container(cfg), "update": 1}
    )
    return run_dir, model.eval(), src_tok, tgt_tok


# ----------------------------------------------------------------------------- scripts


def load_script(name: str):
    """Import ``scripts/{name}.py`` as a module (its ``run(cfg)`` / ``main()``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_script_{name}", REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses defined in the script look their module up there
    spec.loader.exec_module(module)
    return module


def compose_script_config(name: str, overrides: list[str]):
    """``configs/{name}.yaml`` composed with Hydra command-line ``overrides``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO_ROOT / "configs"), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)
