"""Ensembles at decoding time: several models of one vocabulary decode as one, through the same
``start_decoding`` / ``decode_step`` / ``state.reorder`` interface, so every search works unchanged.
The scores are the members' log-probabilities averaged, i.e. the normalised geometric mean of their
distributions (Marian's and Sockeye's; fairseq averages probabilities).

    loaded = load_models(["runs/a", "runs/b/checkpoint_last.safetensors"])   # a LoadedRun
    hyps = translate_sentences(loaded.model, ids, loaded.cfg.generation, "cpu")"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from transformer.generation.loading import LoadedRun, LoadError, load_run

__all__ = ["EnsembleModel", "EnsembleState", "load_models"]


class EnsembleState:
    """The decoding states of every member (one per model), reordered together."""

    def __init__(self, states: Sequence[Any]) -> None:
        self.states = list(states)

    def reorder(self, index: Tensor, host_index: Sequence[int] | None = None) -> None:
        """Select (and repeat) rows of every member's state
        (:meth:`~transformer.models.state.DecodingState.reorder`)."""
        for state in self.states:
            state.reorder(index, host_index)

    def reserve(self, steps: int) -> None:
        """Room for ``steps`` more tokens in every member's caches (see
        :meth:`transformer.models.state.DecodingState.reserve`; a member's state without it is skipped)."""
        for state in self.states:
            reserve = getattr(state, "reserve", None)
            if reserve is not None:
                reserve(steps)

    @property
    def batch_size(self) -> int:
        """Number of rows (sentences x beams)."""
        return self.states[0].batch_size


class EnsembleModel(nn.Module):
    """Several models of one family, special ids and output vocabulary decoding as one.

    Raises:
        ValueError: no model, or members that differ in family, special ids or output size (named).
    """

    def __init__(self, models: Sequence[nn.Module], checkpoints: Sequence[Path | str] = ()) -> None:
        super().__init__()
        if not models:
            raise ValueError("an ensemble needs at least one model")
        first = models[0]
        for i, m in enumerate(models[1:], start=1):
            for attr in ("arch", "pad_id", "eos_id", "decoder_start_token_id"):
                if getattr(m, attr) != getattr(first, attr):
                    raise ValueError(
                        f"ensemble member {i} has {attr}={getattr(m, attr)!r}, member 0 "
                        f"{getattr(first, attr)!r}: every member must decode the same way"
                    )
            sizes = [getattr(getattr(x, "output_proj", None), "out_features", None) for x in (m, first)]
            if sizes[0] != sizes[1]:
                raise ValueError(
                    f"ensemble member {i} scores {sizes[0]} tokens, member 0 {sizes[1]}: "
                    "the members need one target vocabulary"
                )
        self.models = nn.ModuleList(models)
        self.arch, self.pad_id, self.eos_id = first.arch, first.pad_id, first.eos_id
        self.decoder_start_token_id = first.decoder_start_token_id
        self.checkpoints = [Path(c) for c in checkpoints]

    def start_decoding(self, src_tokens: Tensor) -> EnsembleState:
        """Run every member's encoder (or source prefix). Args: src_tokens ``(batch, src_len)``."""
        return EnsembleState([m.start_decoding(src_tokens) for m in self.models])

    def decode_step(self, tokens: Tensor, state: EnsembleState) -> Tensor:
        """One step of every member; returns the mean of their log-probabilities ``(batch, vocab)`` fp32."""
        total = None
        for m, s in zip(self.models, state.states):
            lp = torch.log_softmax(m.decode_step(tokens, s).float(), dim=-1)
            total = lp if total is None else total.add_(lp)
        return total.div_(len(self.models))


def _pieces(tok: Any) -> list[str]:
    return [tok.id_to_piece(i) for i in range(len(tok))]


def load_models(
    checkpoints: str | Path | Sequence[str | Path],
    device: str | torch.device = "cpu",
    *,
    src_tokenizer: str | Path | None = None,
    tgt_tokenizer: str | Path | None = None,
    overrides: list[str] | None = None,
) -> LoadedRun:
    """Load one checkpoint (:func:`~transformer.generation.loading.load_run`) or an ensemble of several,
    as a :class:`~transformer.generation.loading.LoadedRun` whose ``model`` is an :class:`EnsembleModel`
    with the first checkpoint's tokenizers, config and run folder.

    Raises:
        LoadError: a checkpoint that does not load, an empty list, or members whose vocabularies or
            model families differ from the first's (both named).
    """
    if isinstance(checkpoints, (str, Path)):
        return load_run(
            checkpoints, device, src_tokenizer=src_tokenizer, tgt_tokenizer=tgt_tokenizer, overrides=overrides
        )
    paths = list(checkpoints)
    if not paths:
        raise LoadError("checkpoint=[] names no checkpoint")
    runs = [
        load_run(p, device, src_tokenizer=src_tokenizer, tgt_tokenizer=tgt_tokenizer, overrides=overrides)
        for p in paths
    ]
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    for run in runs[1:]:
        if run.model.arch != first.model.arch:
            raise LoadError(
                f"{run.checkpoint} is {run.model.arch} but {first.checkpoint} is {first.model.arch}: "
                "an ensemble decodes one model family"
            )
        for side, a, b in (
            ("source", first.tokenizers.src, run.tokenizers.src),
            ("target", first.tokenizers.tgt, run.tokenizers.tgt),
        ):
            if _pieces(a) != _pieces(b):
                raise LoadError(
                    f"{run.checkpoint} cannot join an ensemble with {first.checkpoint}: its {side} vocabulary "
                    f"({b.model_path}, {len(b)} pieces) differs from {a.model_path} ({len(a)} pieces); the "
                    "models' log-probabilities are averaged token by token, so every model needs the same "
                    "SentencePiece vocabulary"
                )
    try:
        model = EnsembleModel([r.model for r in runs], [r.checkpoint for r in runs])
    except ValueError as e:
        raise LoadError(str(e)) from e
    return LoadedRun(
        model=model.eval(),
        tokenizers=first.tokenizers,
        cfg=first.cfg,
        run_dir=first.run_dir,
        checkpoint=first.checkpoint,
    )
