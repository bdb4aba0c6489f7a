"""The work of ``scripts/evaluate.py`` (``configs/evaluate.yaml``): BLEU and chrF (sacreBLEU, with
signatures) of a trained run on its test splits, and paired bootstrap between systems.

``checkpoint=...`` translates each split's raw sources with the run's tokenizer and settings and
scores against the raw references into ``<run>/eval/<checkpoint name>/``, a folder ``compare.py``
reads as a run; ``refs=FILE hyps=[...]`` scores files. docs/decoding.md. Unlike the rest of
``transformer.evaluation``, this module loads models, and the package does not import it."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from transformer.config import ConfigError, GenerationConfig, config_dict
from transformer.data.corpus import read_lines, read_parallel, resolve_split_files
from transformer.evaluation.metrics import corpus_scores, paired_bootstrap
from transformer.generation import detokenize, prepare_decoding, translate_sentences
from transformer.runs.folder import EVAL_DIR, checkpoint_stem, test_time_tag

__all__ = ["evaluate", "evaluate_checkpoint", "score_files"]


def _read(path: str) -> list[str]:
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"file not found: {p}")
    return read_lines(p)


def _paths(value: Any) -> list[str]:
    """``hyps=FILE`` (one path) or ``hyps=[FILE,...]`` as a list of paths."""
    if value is None:
        return []
    if isinstance(value, (str, Path)):
        return [str(value)] if str(value) else []
    return [str(v) for v in value]


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _describe(gen: GenerationConfig) -> str:
    if gen.strategy == "beam":
        return f"beam {gen.beam_size}, length penalty {gen.length_penalty} ({gen.length_penalty_form})"
    if gen.strategy == "sample":
        return f"sampling T={gen.temperature} top_k={gen.top_k} top_p={gen.top_p} seed={gen.seed}"
    return "greedy"


def _bootstrap(
    baseline: list[str], systems: dict[str, list[str]], refs: list[str], cfg: Any, tokenize: str, lowercase: bool
) -> dict[str, Any]:
    """Paired bootstrap of ``systems`` against ``baseline``, printed as a table; returns sacreBLEU's results."""
    res = paired_bootstrap(
        baseline,
        systems,
        refs,
        n_samples=int(cfg.bootstrap_samples),
        seed=cfg.bootstrap_seed,
        tokenize=tokenize,
        lowercase=lowercase,
    )
    print("paired bootstrap resampling (sacreBLEU), baseline first:")
    print(f"  {'system':<40} {'BLEU':>7} {'p':>7} {'chrF':>7} {'p':>7}")
    for name, r in res.items():
        p_b = "" if r["bleu_p_value"] is None else f"{r['bleu_p_value']:.4f}"
        p_c = "" if r["chrf_p_value"] is None else f"{r['chrf_p_value']:.4f}"
        print(f"  {name:<40} {r['bleu']:7.2f} {p_b:>7} {r['chrf']:7.2f} {p_c:>7}")
    sig = next(iter(res.values()))["signatures"]
    print(f"  BLEU|{sig['bleu']}\n  chrF2|{sig['chrf']}")
    return res


def score_files(cfg: Any) -> dict[str, Any]:
    """Files mode: score every file of ``cfg.hyps`` against ``cfg.refs``, with a paired bootstrap
    against the first when there are several; ``results.json`` into ``cfg.output_dir`` when set.

    Returns:
        ``{"scores": {file: corpus_scores(...)}}``, plus ``"bootstrap"`` with several files.

    Raises:
        ConfigError: no ``refs`` or ``hyps``, or a file whose line count differs from the references'.
        FileNotFoundError: a missing file.
    """
    hyp_files = _paths(cfg.hyps)
    if not cfg.refs or not hyp_files:
        raise ConfigError("give checkpoint=PATH, or refs=FILE with hyps=FILE or hyps=[FILE,...] to score files")
    tokenize = cfg.tokenize or "13a"
    lowercase = bool(cfg.lowercase) if cfg.lowercase is not None else False
    refs = _read(cfg.refs)
    systems = {h: _read(h) for h in hyp_files}
    for name, hyps in systems.items():
        if len(hyps) != len(refs):
            raise ConfigError(f"{name} has {len(hyps)} lines but {cfg.refs} has {len(refs)}: the lines must pair up")
    results: dict[str, Any] = {"scores": {}}
    for name, hyps in systems.items():
        s = corpus_scores(hyps, refs, tokenize=tokenize, lowercase=lowercase)
        results["scores"][name] = s
        print(f"{name}: BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f}")
    first = next(iter(systems.values()))
    print(f"BLEU|{results['scores'][hyp_files[0]]['bleu_signature']}")
    print(f"chrF2|{results['scores'][hyp_files[0]]['chrf_signature']}")
    if len(systems) > 1:
        names = list(systems)
        results["bootstrap"] = _bootstrap(first, {n: systems[n] for n in names[1:]}, refs, cfg, tokenize, lowercase)
    if cfg.output_dir:
        out = Path(cfg.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    return results


def evaluate_checkpoint(cfg: Any) -> dict[str, Any]:
    """Checkpoint mode: translate the test splits with a run (or an ensemble), score them, and
    optionally bootstrap one split against a baseline file.

    A line that cannot be translated is reported on stderr, left empty and listed in
    ``failed_lines``. ``<output_dir>/<split>.txt`` and ``results.json`` are written once every split
    is done; a bad split or baseline stops it before anything is translated.

    Returns:
        ``{"checkpoint", "test_time", "limit", "generation", "precision", "tokenize", "lowercase",
        "splits"}`` as in ``results.json``, plus ``"bootstrap"``; one checkpoint also gives ``"config"``
        (the model as evaluated) and ``"trained"`` (the run's results without scores).

    Raises:
        LoadError: a missing or foreign checkpoint, a mismatched tokenizer, ensemble members of
            different vocabularies, a test-time RoPE scaling of a run without RoPE.
        ConfigError: no split, a baseline with several splits or another line count, invalid
            generation settings, or ``device=cuda`` without a GPU.
        DataError: a split whose files are missing.
        FileNotFoundError: a missing baseline file.
    """
    prepared = prepare_decoding(cfg)
    loaded, gen, device, test_time, members = (
        prepared.loaded,
        prepared.gen,
        prepared.device,
        prepared.test_time,
        prepared.members,
    )
    run_cfg = loaded.cfg
    for key, value in cfg.data.items():
        if value is not None:
            setattr(run_cfg.data, key, value)
    tokenize = cfg.tokenize or run_cfg.data.bleu_tokenize
    lowercase = bool(cfg.lowercase) if cfg.lowercase is not None else bool(run_cfg.data.lowercase)
    splits = list(cfg.splits) if cfg.splits else list(run_cfg.data.test_splits or [])
    if not splits:
        raise ConfigError("no splits to evaluate: the run has no data.test_splits; pass splits=[...]")
    if cfg.baseline and len(splits) != 1:
        raise ConfigError(f"baseline=FILE compares one split, but {len(splits)} are requested; pass splits=[NAME]")
    # named by checkpoint: evaluating another checkpoint of the run does not overwrite these results
    name = _ensemble_name(members) if members else _checkpoint_name(loaded.checkpoint)
    if test_time:  # its own folder: the run's plain evaluation is not overwritten
        name = f"{name}+{test_time_tag(test_time)}"
    out_dir = Path(cfg.output_dir) if cfg.output_dir else loaded.run_dir / EVAL_DIR / name
    files = {
        split: resolve_split_files(run_cfg.data, split) for split in splits
    }  # every split's files, before any work
    base = _read(cfg.baseline) if cfg.baseline else None
    src_tok, tgt_tok = loaded.tokenizers
    results: dict[str, Any] = {
        "checkpoint": [str(m) for m in members] if members else str(loaded.checkpoint),
        "test_time": test_time,
        "limit": int(cfg.limit or 0),
        "generation": config_dict(gen),
        "precision": prepared.precision,  # the search's (fp32 on the CPU; autocast on an accelerator)
        "tokenize": tokenize,
        "lowercase": lowercase,
        "splits": {},
    }
    if not members:  # one model: the folder reads as a run of the model as evaluated (scripts/compare.py)
        results.update(_as_run(loaded.run_dir, run_cfg, gen))
    on = "" if prepared.precision == "fp32" else f", {prepared.precision}"
    print(
        f"{prepared.source} ({run_cfg.model.arch}, {run_cfg.data.src_lang}->{run_cfg.data.tgt_lang}, "
        f"{_describe(gen)}{on})"
    )
    if test_time:
        print(f"  at test time: {' '.join(test_time)}")
    outputs: dict[str, list[str]] = {}  # written with results.json once every split is done
    for split in splits:
        src_file, ref_file = files[split]
        src_lines, refs, _ = read_parallel(src_file, ref_file, keep_empty=True)  # every line is scored
        if cfg.limit and cfg.limit > 0:
            src_lines, refs = src_lines[: cfg.limit], refs[: cfg.limit]
        start = time.time()
        errors: dict[int, str] = {}
        hyps_tok = translate_sentences(
            loaded.model,
            src_tok.encode_batch(src_lines),
            gen,
            device,
            loaded.model.arch,
            errors=errors,
            progress=bool(cfg.progress),
            desc=split,
            precision=prepared.precision,
        )
        seconds = time.time() - start
        for i, msg in sorted(errors.items()):
            _log(f"error: {split} line {i + 1} ({src_file}): {msg}; its hypothesis is left empty")
        hyps = outputs[split] = detokenize(hyps_tok, tgt_tok)
        s = corpus_scores(hyps, refs, tokenize=tokenize, lowercase=lowercase)
        s.update(
            sentences=len(refs),
            empty_sources=sum(not line.strip() for line in src_lines),
            failed_lines=[i + 1 for i in sorted(errors)],
            seconds=seconds,
            sentences_per_s=len(refs) / max(seconds, 1e-9),
            hyp_file=str(out_dir / f"{split}.txt"),
        )
        results["splits"][split] = s
        failed = f", {len(errors)} could not be translated" if errors else ""
        print(
            f"{split}: BLEU {s['bleu']:.2f} chrF {s['chrf']:.2f} ({len(refs)} sentences{failed}, "
            f"{s['sentences_per_s']:.1f} sent/s)"
        )
        print(f"  BLEU|{s['bleu_signature']}\n  chrF2|{s['chrf_signature']}")
        if base is not None:
            if cfg.limit and cfg.limit > 0:
                base = base[: cfg.limit]
            if len(base) != len(refs):
                raise ConfigError(f"baseline {cfg.baseline} has {len(base)} lines but {split} has {len(refs)}")
            results["bootstrap"] = _bootstrap(base, {"checkpoint": hyps}, refs, cfg, tokenize, lowercase)
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, hyps in outputs.items():
        (out_dir / f"{split}.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (out_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    _log(f"wrote {out_dir / 'results.json'}")
    return results


_SCORES = ("bleu", "chrf", "sacrebleu_signature", "chrf_signature", "test_split", "test", "config", "test_weights")
"""The keys of a training run's ``results.json`` that an evaluation replaces (its scores, its config,
the file of its test weights: the evaluation's own is ``checkpoint``)."""


def _as_run(run_dir: Path, run_cfg: Any, gen: GenerationConfig) -> dict[str, Any]:
    """What makes an evaluation folder readable as a run by ``scripts/compare.py``
    (:func:`transformer.analysis.collect.load_run`): ``config``, the model as evaluated (the run's
    config with the test-time overrides and this evaluation's generation settings), and
    ``trained``, the training run's ``results.json`` without its scores (the group choices,
    parameters, budget, resolved precision and machine; empty when the run has none)."""
    config = config_dict(run_cfg)
    config["generation"] = config_dict(gen)
    try:
        trained = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        trained = {}
    trained = {k: v for k, v in trained.items() if k not in _SCORES} if isinstance(trained, dict) else {}
    return {"config": config, "trained": trained}


def _checkpoint_name(weights: Path) -> str:
    """``checkpoint_best.safetensors`` -> ``checkpoint_best``."""
    return checkpoint_stem(weights).name


def _ensemble_name(checkpoints: list[Path]) -> str:
    """``ensemble_<n>_<8 hex digits of the resolved paths>``: one results folder per set of members."""
    digest = hashlib.sha1("\n".join(str(Path(c).resolve()) for c in checkpoints).encode()).hexdigest()[:8]
    return f"ensemble_{len(checkpoints)}_{digest}"


def evaluate(cfg: Any) -> dict[str, Any]:
    """What ``scripts/evaluate.py`` does: :func:`evaluate_checkpoint` when ``cfg.checkpoint`` is set,
    else :func:`score_files`; raises what they raise."""
    return evaluate_checkpoint(cfg) if cfg.checkpoint else score_files(cfg)
