"""The targets the ``realistic`` section's table reads against, judged from its rows,
and the base model's MFU target read from the ``trainer`` section's rows: ``met``, ``missed`` or
``not measured`` (a row skipped by the budget, failed, or not in the plan)."""

from __future__ import annotations

from typing import Any

TARGETS = (
    # (key, what, bound, unit)
    ("base_mfu", "transformer_2017_base: bf16 MFU at >= 16k target tokens per batch", 0.35, "MFU"),
    ("base_vs_marian", "transformer_2017_base: target tok/s against HF Marian at the same batch", 1.3, "x"),
    ("big_mfu", "transformer_2017_big: bf16 MFU at >= 16k target tokens per batch", 0.45, "MFU"),
    ("beam_vs_hf", "beam-5 decoding, 1,000 sentences at batch 64: sentences/s against HF generate", 5.0, "x"),
)


def _best(rows: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    measured = [x for x in rows if key in x]
    return max(measured, key=lambda x: x[key]) if measured else None


def _record(key: str, what: str, bound: float, unit: str, value: float | None, detail: str) -> dict[str, Any]:
    status = "not measured" if value is None else "met" if value >= bound else "missed"
    return {
        "target": key,
        "what": what,
        "bound": bound,
        "unit": unit,
        "value": value,
        "status": status,
        "detail": detail,
    }


def evaluate_targets(
    rows: list[dict[str, Any]], decoding: list[dict[str, Any]], min_tokens: int = 16384
) -> list[dict[str, Any]]:
    """One record per :data:`TARGETS` entry: ``value``, ``status`` and ``detail`` (the rows it read).

    MFU targets take our best row (any mode) of the model at a batch of ``min_tokens`` or more; the
    ratio to HF Marian takes, at every batch where both were measured, our best mode against
    Marian's best mode, and the smallest of those ratios is the value (the target holds at every
    batch); the decoding ratio is our beam-5 sentences/s over HF ``generate``'s.
    """
    out = []

    def ours(model: str, system: str = "ours") -> list[dict[str, Any]]:
        return [x for x in rows if x["model"] == model and x["system"] == system and "tok_s" in x]

    for key, what, bound, unit in TARGETS:
        value, detail = None, ""
        if key in ("base_mfu", "big_mfu"):
            best = _best([x for x in ours(key.split("_")[0]) if x["max_tokens"] >= min_tokens], "mfu")
            if best:
                value = best["mfu"]
                detail = f"{best['mode']}, {best['max_tokens']} tokens: {100 * value:.1f}%"
        elif key == "base_vs_marian":
            ratios = []
            for tokens in sorted({x["max_tokens"] for x in ours("base")}):
                a = _best([x for x in ours("base") if x["max_tokens"] == tokens], "tok_s")
                b = _best([x for x in ours("base", "HF Marian") if x["max_tokens"] == tokens], "tok_s")
                if a and b:
                    ratios.append((a["tok_s"] / b["tok_s"], tokens, a["mode"], b["mode"]))
            if ratios:
                value = min(r[0] for r in ratios)
                detail = "; ".join(f"{t}: {r:.2f}x (ours {ma} / Marian {mb})" for r, t, ma, mb in ratios)
        else:
            speed = {(x["system"], x["strategy"]): x["sentences_per_s"] for x in decoding if "sentences_per_s" in x}
            if ("ours", "beam5") in speed and ("HF generate", "beam5") in speed:
                value = speed[("ours", "beam5")] / speed[("HF generate", "beam5")]
                detail = f"ours {speed[('ours', 'beam5')]:.1f} vs HF {speed[('HF generate', 'beam5')]:.1f} sentences/s"
        out.append(_record(key, what, bound, unit, value, detail))
    return out


TRAINER_TARGET = ("base_trainer_mfu", "bf16 MFU through Trainer.train_step (WMT-like lengths, 16k tokens)", 0.35)


def evaluate_trainer_target(rows: list[dict[str, Any]], model: str, min_tokens: int = 16384) -> dict[str, Any] | None:
    """The base model's MFU target read from the trainer section's rows (its best mode): what a
    user's update reaches, data path and all; None for another model (the targets name the base).

    Rows skipped, failed or at fewer than ``min_tokens`` tokens per batch are not read."""
    if model != "base":
        return None
    key, what, bound = TRAINER_TARGET
    best = _best([x for x in rows if x.get("max_tokens", 0) >= min_tokens], "mfu")
    value = best["mfu"] if best else None
    detail = f"{best['mode']}, {best['max_tokens']} tokens: {100 * value:.1f}%" if best else ""
    return _record(key, f"transformer_2017_base: {what}", bound, "MFU", value, detail)
