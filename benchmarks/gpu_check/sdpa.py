"""The ``sdpa`` section of the GPU check (``benchmarks/gpu_check/``): which ``scaled_dot_product_attention``
kernel ran for every attention call (torch.profiler), and which backends each call could use
(replayed with one backend allowed at a time) with torch's reasons for the others."""

from __future__ import annotations

import json
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from benchmarks import one_line, synchronize
from benchmarks.train_step import make_trainer
from transformer.config import GenerationConfig
from transformer.generation import translate_sentences
from transformer.modules.attention import Attention
from transformer.modules.mla import MultiHeadLatentAttention

from .context import Context, load_data, run_config
from .report import Report, Stopped, check

_BACKEND_OPS = {  # aten op (prefix) -> backend
    "aten::_scaled_dot_product_flash_attention_for_cpu": "flash (CPU)",
    "aten::_scaled_dot_product_flash_attention": "flash",
    "aten::_scaled_dot_product_efficient_attention": "memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "cudnn",
    "aten::_scaled_dot_product_attention_math": "math",
    "aten::_scaled_dot_product_fused_attention_overrideable": "overrideable",
}


def backend_of(op_name: str) -> str | None:
    """The SDPA backend an aten op name belongs to (None for other ops)."""
    for prefix, backend in _BACKEND_OPS.items():
        if op_name == prefix or (op_name.startswith(prefix) and "backward" not in op_name):
            return backend
    return None


class SdpaRecorder:
    """Wraps ``F.scaled_dot_product_attention`` (every SDPA call of the project goes through it):
    each call runs inside ``record_function("sdpa_call#i")`` and is described (attention module,
    shapes, dtype, mask, causal flag); one call of each distinct description keeps its arguments
    for the eligibility replay. Forward hooks on the attention modules name the calling module."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.calls: list[dict[str, Any]] = []
        self.samples: dict[str, tuple] = {}
        self.stack: list[str] = []
        self.handles: list[Any] = []
        self.original = F.scaled_dot_product_attention

    def __enter__(self) -> SdpaRecorder:
        def enter(name: str) -> Callable[..., None]:
            def hook(module: Any, args: Any) -> None:
                self.stack.append(name)

            return hook

        def leave(module: Any, args: Any, output: Any) -> None:  # returns None: the output is unchanged
            self.stack.pop()

        for name, mod in self.model.named_modules():
            if isinstance(mod, (Attention, MultiHeadLatentAttention)):
                self.handles.append(mod.register_forward_pre_hook(enter(name)))
                self.handles.append(mod.register_forward_hook(leave))
        original = self.original

        def wrapper(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            module = self.stack[-1] if self.stack else "?"
            mask = "none" if attn_mask is None else f"{attn_mask.dtype} {tuple(attn_mask.shape)}".replace("torch.", "")
            desc = {
                "module": module,
                "role": attention_role(module),
                "q": tuple(q.shape),
                "k": tuple(k.shape),
                "dtype": str(q.dtype).replace("torch.", ""),
                "mask": mask,
                "is_causal": bool(is_causal),
                "dropout_p": float(dropout_p),
                "enable_gqa": bool(enable_gqa),
                "requires_grad": q.requires_grad,
            }
            key = json.dumps(
                {k2: desc[k2] for k2 in ("role", "dtype", "is_causal", "enable_gqa", "requires_grad")}
                | {"mask": mask.split(" ")[0], "q1": q.shape[2] == 1}
            )
            desc["key"] = key
            i = len(self.calls)
            self.calls.append(desc)
            if key not in self.samples:  # detached copies; q, k, v keep whether they needed gradients
                self.samples[key] = tuple(
                    x.detach().clone().requires_grad_(x.requires_grad and x.is_floating_point())
                    if isinstance(x, torch.Tensor)
                    else x
                    for x in (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
                )
            with torch.profiler.record_function(f"sdpa_call#{i}"):
                kw = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
                return original(q, k, v, enable_gqa=enable_gqa, **kw)

        torch.nn.functional.scaled_dot_product_attention = wrapper
        return self

    def __exit__(self, *exc: Any) -> None:
        torch.nn.functional.scaled_dot_product_attention = self.original
        for h in self.handles:
            h.remove()


def attention_role(module: str) -> str:
    """``encoder self-attention`` / ``decoder self-attention`` / ``cross-attention`` from a module's name."""
    if "cross" in module:
        return "cross-attention"
    if module.startswith("encoder"):
        return "encoder self-attention"
    return "decoder self-attention"


def _descendants(evt: Any) -> list[Any]:
    out, todo = [], list(getattr(evt, "cpu_children", []) or [])
    while todo:
        e = todo.pop()
        out.append(e)
        todo.extend(getattr(e, "cpu_children", []) or [])
    return out


def attribute_backends(prof: Any, calls: list[dict[str, Any]]) -> None:
    """Fill ``backend`` (and ``kernels``) of every recorded call from the profile's events. With CUDA
    activity a call's range appears twice (the CPU range with the aten ops, and a ``gpu_user_annotation``
    without children): what either holds counts, so the second cannot overwrite the first."""
    found: dict[int, list[str]] = {}
    kernels: dict[int, set[str]] = {}
    for evt in prof.events():
        if not evt.name.startswith("sdpa_call#"):
            continue
        i = int(evt.name.split("#", 1)[1])
        if i >= len(calls):
            continue
        for child in _descendants(evt):
            b = backend_of(child.name)
            if b:
                found.setdefault(i, []).append(b)
            for kern in getattr(child, "kernels", []) or []:
                kernels.setdefault(i, set()).add(getattr(kern, "name", str(kern))[:120])
    for i, call in enumerate(calls):
        call["backend"] = found[i][0] if found.get(i) else "unidentified"
        call["kernels"] = sorted(kernels.get(i, ()))[:4]


def eligible_backends(sample: tuple, device: torch.device) -> tuple[list[str], dict[str, str]]:
    """Replay one SDPA call with each backend alone: those that run, and torch's reason for the others."""
    q, k, v, mask, dropout_p, is_causal, scale, gqa = sample
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    if device.type == "cuda":
        backends.update(efficient=SDPBackend.EFFICIENT_ATTENTION, cudnn=SDPBackend.CUDNN_ATTENTION)
    ok, why = [], {}
    for name, b in backends.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([b]):
                    F.scaled_dot_product_attention(
                        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=gqa
                    )
                ok.append(name)
            except Exception as err:  # RuntimeError: no available kernel
                reasons: list[str] = []
                for w in caught:  # torch warns why each kernel was refused, then raises "No available kernel"
                    text = " ".join(str(w.message).split("(Triggered internally")[0].split())
                    if text and text not in reasons:
                        reasons.append(text)
                why[name] = (" | ".join(reasons) or " ".join(str(err).split()))[:400]
    return ok, why


def summarise_calls(
    calls: list[dict[str, Any]], samples: dict[str, tuple], device: torch.device
) -> list[dict[str, Any]]:
    """One row per distinct kind of call: count, backends that ran, eligibility and reasons."""
    rows: dict[str, dict[str, Any]] = {}
    for c in calls:
        row = rows.setdefault(
            c["key"],
            {
                "role": c["role"],
                "dtype": c["dtype"],
                "mask": c["mask"].split(" ")[0],
                "mask_example": c["mask"],
                "is_causal": c["is_causal"],
                "enable_gqa": c["enable_gqa"],
                "q_example": c["q"],
                "k_example": c["k"],
                "requires_grad": c["requires_grad"],
                "calls": 0,
                "backends": {},
                "kernels": set(),
            },
        )
        row["calls"] += 1
        row["backends"][c.get("backend", "unidentified")] = row["backends"].get(c.get("backend", "unidentified"), 0) + 1
        row["kernels"].update(c.get("kernels", []))
    for key, row in rows.items():
        row["kernels"] = sorted(row["kernels"])[:4]
        row["eligible"], row["not_eligible_because"] = eligible_backends(samples[key], device)
        row["used"] = ", ".join(f"{b} x{n}" for b, n in row["backends"].items())
        row["eligible_shown"] = ", ".join(row["eligible"])
        why = [f"{b}: {w}" for b, w in row["not_eligible_because"].items() if b in ("flash", "efficient")]
        row["why"] = "; ".join(why)[:240]
    return list(rows.values())


def profile_sdpa(ctx: Context, family: str, precision: str, phases: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The SDPA calls of one training forward (``train``) and of greedy / beam decoding."""
    data = load_data(ctx)
    cfg = run_config(ctx, f"sdpa_{family}_{precision}", family, precision, False, 1, ctx.device.type)
    trainer = make_trainer(cfg, data, ctx.device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.type == "cuda" else [])
    out: dict[str, list[dict[str, Any]]] = {}
    split = data.splits.get("test_2016_flickr") or data.splits["test"]
    src = [list(split.src[i]) for i in range(min(4, len(split)))]  # the kernels do not depend on the count
    for phase in phases:
        rec = SdpaRecorder(trainer.model)
        with rec, profile(activities=activities) as prof:
            if phase == "train forward":
                trainer.model.train()
                batch = next(trainer.batches())
                out_loss = trainer.micro_loss(batch)
                backward = out_loss["loss"]
            else:
                trainer.model.eval()
                # a few steps are enough: every step after the first calls SDPA the same way
                gen = GenerationConfig(
                    strategy="greedy" if phase == "greedy decoding" else "beam",
                    beam_size=1 if phase == "greedy decoding" else 5,
                    max_len_a=0.0,
                    max_len_b=6,
                )
                with torch.inference_mode():
                    translate_sentences(trainer.model, src, gen, ctx.device)
            synchronize(ctx.device)
        attribute_backends(prof, rec.calls)
        rows = summarise_calls(rec.calls, rec.samples, ctx.device)
        if phase == "train forward":
            with profile(activities=activities) as prof_b:
                backward.backward()
                synchronize(ctx.device)
            names: dict[str, int] = {}
            for evt in prof_b.events():
                if "attention" in evt.name and "backward" in evt.name and evt.name.startswith("aten::_"):
                    names[evt.name] = names.get(evt.name, 0) + 1
            for row in rows:
                row["backward_ops_in_step"] = names
        out[phase] = rows
    return out


def section_sdpa(sec: dict[str, Any], ctx: Context, report: Report) -> None:
    """Both families, fp32 and bf16 training forward, fp32 decoding."""
    ctx.budget.need(20, "sdpa")
    r = sec["results"]
    found = r["calls"] = []
    for family in ("encoder-decoder", "decoder-only"):
        for precision in ("fp32", "bf16"):
            phases = ["train forward"] + (["greedy decoding", "beam decoding"] if precision == "fp32" else [])
            try:
                res = profile_sdpa(ctx, family, precision, phases)
            except Stopped:
                raise
            except Exception as err:  # the other family / precision still runs
                r.setdefault("errors", {})[f"{family} {precision}"] = traceback.format_exc(limit=10)[-3000:]
                check(sec, f"{family} {precision}: profiled", False, one_line(err, 300))
                report.write()
                continue
            found += [
                {**row, "family": family, "precision": precision, "phase": p} for p, rows in res.items() for row in rows
            ]
            report.write()
    kernels = sorted({k for x in found for k in x["kernels"]})[:12]
    back = {
        f"{x['family']} {x['precision']}: {k}": n for x in found for k, n in x.get("backward_ops_in_step", {}).items()
    }
    r["summary"] = ["How PyTorch picks a backend, and which mask the project passes: docs/gpu.md (The GPU check)."]
    if kernels:
        r["summary"].append("CUDA kernels seen under the SDPA calls: " + ", ".join(f"`{k}`" for k in kernels))
    if back:
        r["summary"].append(
            "Backward attention ops of the training step: " + "; ".join(f"{k} x{n}" for k, n in back.items())
        )
    unknown = [f"{x['family']} {x['phase']} {x['role']}" for x in found if "unidentified" in x["backends"]]
    calls = f"{sum(x['calls'] for x in found)} calls"
    check(sec, "a backend identified for every SDPA call", not unknown and bool(found), "; ".join(unknown[:5]) or calls)
    if ctx.device.type == "cpu":
        used = {b for x in found for b in x["backends"]}
        check(sec, "CPU backends only", used <= {"flash (CPU)", "math"}, ", ".join(sorted(used)))
