"""Greedy, beam and sampling search on tiny seeded models over every family and option combination
the search tests cover, as a table of cases whose outputs are recorded in ``search_outputs.json``
(:mod:`tests.generation.test_search_unchanged` holds the searches to them).

The outputs were recorded before the searches stopped reading the device every step, from the searches
as they were then; record them again only for a deliberate change of the hypotheses:

    python -m tests.generation.search_cases   # rewrites tests/generation/search_outputs.json
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.generation.helpers import EOS, TableModel, make_model, make_src
from transformer.generation import EnsembleModel, generate

OUTPUTS = Path(__file__).with_name("search_outputs.json")
ARCHS = ("encoder_decoder", "decoder_only")
MIXED = {"encoder_decoder": dict(eos_bias=5.5, scale=2.0), "decoder_only": dict(eos_bias=2.5, scale=2.0)}
LENGTHS = [3, 5, 7, 9, 4, 6, 2, 8]


def _nan(arch: str) -> nn.Module:
    model = make_model(arch, 12)
    with torch.no_grad():
        model.output_proj.weight.fill_(float("nan"))
    return model


def _half_nan(arch: str) -> nn.Module:
    """NaN output for the rows whose previous token is odd (some rows and beams die, others finish)."""
    model = make_model(arch, 40, **MIXED[arch])
    step = model.decode_step

    def decode_step(tokens, state):
        out = step(tokens, state)
        return out.masked_fill((tokens[:, -1] % 2 == 1)[:, None] & (tokens[:, -1] > 4)[:, None], float("nan"))

    model.decode_step = decode_step
    return model


MODELS: dict[str, Callable[[str], nn.Module]] = {
    "mixed": lambda arch: make_model(arch, 40, **MIXED[arch]),
    "rope": lambda arch: make_model(arch, 40, seed=2, **MIXED[arch], position__name="rope"),
    "alibi": lambda arch: make_model(arch, 40, seed=2, **MIXED[arch], position__name="alibi"),
    "learned": lambda arch: make_model(arch, 40, seed=3, **MIXED[arch], position__name="learned", max_positions=16),
    "window": lambda arch: make_model(arch, 40, seed=4, **MIXED[arch], attention_window=3),
    "no_eos": lambda arch: make_model(arch, 40, eos_bias=-50.0),
    "eos_first": lambda arch: make_model(arch, 40, eos_bias=50.0),
    "repeats": lambda arch: make_model(arch, 40, scale=4.0),
    "nan": _nan,
    "half_nan": _half_nan,
    "ensemble": lambda arch: EnsembleModel(
        [make_model(arch, 40, **MIXED[arch]), make_model(arch, 40, seed=1, **MIXED[arch])]
    ),
}

GREEDY = [
    dict(max_len_b=4),
    dict(max_len_a=0.5, max_len_b=2, min_len=2),
    dict(max_len_b=12, min_len=3),
    dict(max_len_b=12, no_repeat_ngram_size=1),
    dict(max_len_b=12, no_repeat_ngram_size=2),
    dict(max_len_b=12, no_repeat_ngram_size=3),
    dict(max_len_b=6, length_penalty=0.6),
    dict(max_len_a=0.0, max_len_b=50, min_len=50),
]
BEAM = [
    dict(beam_size=1, max_len_b=4, length_penalty=0.0),
    dict(beam_size=1, max_len_b=4, length_penalty=0.0, length_penalty_form="fairseq"),
    dict(beam_size=4, nbest=3, length_penalty=0.6, max_len_b=3, no_repeat_ngram_size=3),
    dict(beam_size=3, nbest=3, length_penalty=0.6, max_len_b=3),
    dict(beam_size=5, nbest=5, length_penalty=0.0, max_len_b=3),
    dict(beam_size=4, nbest=2, max_len_a=0.5, max_len_b=2, min_len=2),
    dict(beam_size=3, max_len_b=1),
    dict(beam_size=3, max_len_b=12, min_len=3),
    dict(beam_size=3, max_len_b=12, no_repeat_ngram_size=1),
    dict(beam_size=3, max_len_b=12, no_repeat_ngram_size=2),
    dict(beam_size=4, nbest=2, length_penalty=1.0, max_len_b=8),
    dict(beam_size=4, nbest=2, length_penalty=2.0, length_penalty_form="fairseq", max_len_b=8),
    dict(beam_size=4, nbest=4, length_penalty=-1.0, length_penalty_form="fairseq", max_len_b=8),
    dict(beam_size=4, nbest=2, length_penalty=-0.5, max_len_b=8),
    dict(beam_size=2, max_len_a=0.0, max_len_b=50, min_len=50),
]
SAMPLE = [
    dict(seed=7, temperature=1.5, nbest=2, max_len_b=6),
    dict(seed=8, temperature=1.5, nbest=2, max_len_b=6),
    dict(seed=3, top_k=1, max_len_b=4),
    dict(temperature=0.0, max_len_b=6),
    dict(seed=0, temperature=2.0, top_k=5, nbest=3, max_len_b=20, min_len=0),
    dict(seed=1, top_p=0.75, max_len_b=8),
    dict(seed=2, temperature=0.7, top_k=10, top_p=0.9, nbest=3, max_len_b=8),
    dict(seed=4, max_len_a=0.5, max_len_b=2, min_len=2, nbest=2),
    dict(seed=5, max_len_b=12, no_repeat_ngram_size=2),
    dict(seed=6, max_len_a=0.0, max_len_b=50, min_len=50, nbest=2),
]
# which options each model runs (every model runs the first of each list; "all" runs every one)
EVERY = {"mixed", "ensemble", "half_nan"}


def _table(fn_name: str) -> TableModel:
    lp = math.log

    def penalty(prefix):  # a long hypothesis wins only with a positive length penalty
        if len(prefix) == 0:
            return [-1e9, -1e9, -1e9, lp(0.5), lp(0.3), lp(0.2)]
        return (
            [-1e9, -1e9, -1e9, lp(0.01), lp(0.98), lp(0.01)]
            if len(prefix) < 6
            else [-1e9, -1e9, -1e9, lp(0.98), lp(0.01), lp(0.01)]
        )

    def nan_after_7(prefix):
        if 7 in prefix:
            return [float("nan")] * 12
        out = [-3.0] * 12
        out[7], out[EOS] = -0.1, (-0.5 if len(prefix) >= 2 else -9.0)
        return out

    def eos_never(prefix):
        out = [math.log(1 / 11)] * 12
        out[EOS] = float("-inf")
        return out

    return TableModel({"penalty": penalty, "nan_after_7": nan_after_7, "eos_never": eos_never}[fn_name])


TABLES = (
    [
        (
            "penalty",
            dict(
                strategy="beam",
                beam_size=1,
                max_len_a=0.0,
                max_len_b=10,
                min_len=0,
                length_penalty=a,
                length_penalty_form=f,
            ),
        )
        for a, f in ((0.0, "gnmt"), (-1.0, "gnmt"), (2.0, "fairseq"))
    ]
    + [
        (
            "penalty",
            dict(
                strategy="beam",
                beam_size=2,
                max_len_a=0.0,
                max_len_b=10,
                min_len=0,
                length_penalty=-1.0,
                length_penalty_form="fairseq",
            ),
        ),
        ("nan_after_7", dict(strategy="beam", beam_size=2, max_len_a=0.0, max_len_b=6, length_penalty=0.0)),
        ("nan_after_7", dict(strategy="greedy", max_len_a=0.0, max_len_b=6)),
    ]
    + [("eos_never", dict(strategy=s, max_len_a=0.0, max_len_b=5)) for s in ("greedy", "beam", "sample")]
)


def cases() -> Iterator[tuple[str, Callable[[], nn.Module], Any, dict[str, Any]]]:
    """``(name, model factory, source factory, generation settings)`` of every case."""
    for arch in ARCHS:
        for name, factory in MODELS.items():
            vocab = 12 if name == "nan" else 40
            for strategy, options in (("greedy", GREEDY), ("beam", BEAM), ("sample", SAMPLE)):
                chosen = options if name in EVERY else options[:1] + ([options[-1]] if name == "learned" else [])
                for opts in chosen:
                    yield (
                        f"{arch}/{name}/{strategy}/{options.index(opts)}",
                        lambda f=factory, a=arch: f(a),
                        lambda a=arch, v=vocab: make_src(a, LENGTHS, v),
                        dict(strategy=strategy, **opts),
                    )
        vocab, beam = (4, 16) if arch == "encoder_decoder" else (5, 48)  # a beam holding every sequence
        for a, f in ((0.0, "gnmt"), (1.0, "gnmt"), (2.0, "fairseq"), (-1.0, "fairseq"), (-0.5, "gnmt")):
            yield (
                f"{arch}/wide{vocab}/{a}{f}",
                lambda a_=arch, v=vocab: make_model(a_, v, scale=3.0, seed=1),
                lambda a_=arch, v=vocab: make_src(a_, [3, 2], v, seed=1),
                dict(
                    strategy="beam",
                    beam_size=beam,
                    nbest=5,
                    length_penalty=a,
                    length_penalty_form=f,
                    max_len_a=0.0,
                    max_len_b=3,
                    min_len=0,
                ),
            )
    for i, (fn_name, gen) in enumerate(TABLES):
        yield f"table/{fn_name}/{i}", lambda n=fn_name: _table(n), lambda: torch.ones(2, 3, dtype=torch.long), gen


def run_case(model_factory: Callable[[], nn.Module], src_factory: Any, gen: dict[str, Any]) -> dict[str, Any]:
    """The case's hypotheses ``[[tokens, score, logprob], ...]`` per sentence and its warnings."""
    model, src = model_factory(), src_factory()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hyps = generate(model, src, gen)
    return {
        "hyps": [[[h.tokens, h.score, h.logprob] for h in hs] for hs in hyps],
        "warnings": [str(w.message) for w in caught],
    }


def record(path: Path = OUTPUTS) -> int:
    """Run every case and write their outputs to ``path``; returns the number of cases."""
    out = {name: run_case(m, s, g) for name, m, s, g in cases()}
    path.write_text(json.dumps(out, indent=0, sort_keys=True) + "\n", encoding="utf-8")
    return len(out)


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(f"{record()} cases written to {OUTPUTS}", file=sys.stderr)
