"""KV-cache memory of MHA, GQA, MQA, multi-head latent attention and sliding windows (not a test,
and not a timing: a computed table, checked against the caches of a real prefill).

For each attention variant at ``llama_style`` size (decoder-only, 12 layers, d_model 512, 8 heads
of 64) it prints the values one layer caches per token (``2 * n_kv_heads * head_dim`` for K and
V; ``kv_lora_rank + qk_rope_head_dim`` for MLA, DeepSeek-V2 §2.1.4), the bytes per generated token
over all layers (fp32 and bf16), the ratio to MHA, and the bytes one sequence of 4096 tokens
holds (a sliding-window layer keeps only its window: a rolling buffer). Every number comes from
:func:`transformer.models.kv_cache_bytes_per_token` / :func:`~transformer.models.kv_cache_bytes`;
the script also builds each model, prefills one prompt and checks that the tensors its caches hold
add up to the computed bytes.

Usage (from the repository root)::

    python -m benchmarks.kv_cache                                   # -> docs/benchmarks/kv_cache.md
    python -m benchmarks.kv_cache --quick --out /tmp/kv_cache.md    # llama_style_tiny, a seconds-long check
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from benchmarks import REPO
from benchmarks.train_step import preset as compose_preset
from transformer.analysis.markdown import cell
from transformer.analysis.markdown import table as md_table
from transformer.config import model_sizes
from transformer.models import build_model, kv_cache_bytes, kv_cache_bytes_per_token

VARIANTS: list[tuple[str, list[str]]] = [
    ("MHA", ["model/attention=mha"]),
    ("GQA (2 KV heads, the preset)", []),
    ("MQA", ["model/attention=mqa"]),
    ("MLA (derived: kv_lora_rank 4 hd, rope hd/2)", ["model/attention=mla"]),
    (
        "MLA (kv_lora_rank 2 hd, rope hd/4)",
        ["model/attention=mla", "model.attention.kv_lora_rank={2hd}", "model.attention.qk_rope_head_dim={q}"],
    ),
    ("GQA + window 1024 (Mistral: all layers)", ["model.attention_window=1024"]),
    (
        "GQA + window 1024, every 6th layer global (Gemma 3)",
        ["model.attention_window=1024", "model.attention_window_pattern=6"],
    ),
    ("MLA + window 1024", ["model/attention=mla", "model.attention_window=1024"]),
]
SEQUENCE = 4096


def measured_bytes_per_token(cfg: Any, prompt: int = 16) -> float:
    """Bytes the self-attention caches of a built fp32 model hold after a ``prompt``-token prefill,
    divided by ``prompt`` (``prompt`` stays below any window here)."""
    torch.manual_seed(0)
    model = build_model(cfg, 64).eval()
    with torch.no_grad():
        state = model.start_decoding(torch.randint(5, 64, (1, prompt)))
    held = sum(t.numel() * t.element_size() for c in state.self_caches for t in (c.k, c.v))
    return held / prompt


def table(preset: str) -> list[dict[str, Any]]:
    """One row per variant; raises AssertionError when a built model's caches disagree."""
    rows = []
    base = compose_preset(preset)[0]
    hd = base.d_model // base.n_heads
    for name, overrides in VARIANTS:
        overrides = [o.format(**{"2hd": 2 * hd, "q": hd // 4}) for o in overrides]
        cfg = compose_preset(preset, overrides)[0]
        layers = cfg.n_encoder_layers + cfg.n_decoder_layers
        per_token = kv_cache_bytes_per_token(cfg)
        measured = measured_bytes_per_token(cfg)
        assert measured == per_token, (name, measured, per_token)
        rows.append(
            {
                "attention": name,
                "overrides": " ".join(overrides) or "(none)",
                "values_per_layer": model_sizes(cfg).kv_cache_values,
                "layers": layers,
                "fp32": per_token,
                "bf16": kv_cache_bytes_per_token(cfg, 2),
                "sequence": kv_cache_bytes(cfg, SEQUENCE, 2),
            }
        )
    mha = rows[0]["fp32"]
    for r in rows:
        r["ratio"] = r["fp32"] / mha
    return rows


def markdown(preset: str, rows: list[dict[str, Any]]) -> str:
    """The table of :func:`table` as the markdown of ``docs/benchmarks/kv_cache.md``."""
    cfg = compose_preset(preset)[0]
    lines = [
        f"# KV-cache memory per token: MHA, GQA, MQA, MLA and sliding windows at `{preset}` size",
        "",
        f"Decoder-only, {cfg.n_decoder_layers + cfg.n_encoder_layers} layers, d_model {cfg.d_model}, "
        f"{cfg.n_heads} heads of {cfg.d_model // cfg.n_heads}. Computed by `transformer.models.kv_cache_bytes_per_token` "
        "/ `kv_cache_bytes` (`python -m benchmarks.kv_cache`), and checked against the tensors the caches of a "
        "built model hold after a 16-token prefill. Self-attention caches only; a sliding-window layer's "
        f"rolling buffer holds at most its window, so its bytes stop growing there (column: one {SEQUENCE}-token sequence).",
        "",
        *md_table(
            [
                "attention",
                "overrides",
                "values / token / layer",
                "bytes / token (fp32)",
                "bytes / token (bf16)",
                "vs MHA",
                f"{SEQUENCE} tokens (bf16)",
            ],
            "llrrrrr",
            (
                [
                    r["attention"],
                    f"`{r['overrides']}`",
                    cell(r["values_per_layer"]),
                    cell(r["fp32"], "{:,}"),
                    cell(r["bf16"], "{:,}"),
                    cell(r["ratio"], "{:.3f}"),
                    cell(r["sequence"] / 2**20, "{:.1f} MiB"),
                ]
                for r in rows
            ),
        ),
    ]
    lines += [
        "",
        "MLA caches `kv_lora_rank + qk_rope_head_dim` values per layer (the latent and the one rotated key shared by "
        "the heads; DeepSeek-V2 §2.1.4): with the derived sizes that is 4.5 head widths, the cache of GQA with 2.25 "
        "groups, as in the paper (576 values against MHA's 2 x 128 x 128 there). With "
        f"{cfg.n_heads} heads, MLA's saving over MHA is far smaller than at DeepSeek's 128 heads; GQA-2 and MQA cache "
        "less here. The last columns show what a window adds: the cache stops growing at the window.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    """Compute, check, print and write the table (``--quick``: at ``llama_style_tiny`` size)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="llama_style_tiny instead of llama_style")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks" / "kv_cache.md")
    args = parser.parse_args()
    torch.set_num_threads(1)
    preset = "llama_style_tiny" if args.quick else "llama_style"
    text = markdown(preset, table(preset))
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
