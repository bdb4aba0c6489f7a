"""The ``sdpa`` section of the GPU check (``benchmarks/gpu_check/``): which ``scaled_dot_product_attention``
kernel ran for every attention call (torch.profiler), and which backends each call could use
(replayed with one backend allowed at a time) with torch's reasons for the others."""

from __future__ import annotations

import traceback
import warnings
from collections import Counter
from collections.abc import Iterator
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
    each call runs inside ``record_function("sdpa_call#i")``, ``keys[i]`` its kind (attention role,
    dtype, mask, causal and GQA flags, whether it needs gradients, one query or more); ``rows`` one
    record per kind with its count, ``samples`` the arguments of its first call, for the eligibility
    replay. Forward hooks on the attention modules name the calling module."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model, self.original = model, F.scaled_dot_product_attention
        self.keys: list[tuple] = []
        self.rows: dict[tuple, dict[str, Any]] = {}
        self.samples: dict[tuple, tuple] = {}
        self.stack: list[str] = []
        self.handles: list[Any] = []

    def __enter__(self) -> SdpaRecorder:
        def leave(module: Any, args: Any, output: Any) -> None:  # returns None: the output is unchanged
            self.stack.pop()

        for name, mod in self.model.named_modules():
            if isinstance(mod, (Attention, MultiHeadLatentAttention)):
                self.handles.append(mod.register_forward_pre_hook(lambda m, args, name=name: self.stack.append(name)))
                self.handles.append(mod.register_forward_hook(leave))
        original = self.original

        def wrapper(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
            role = attention_role(self.stack[-1] if self.stack else "?")
            mask = "none" if attn_mask is None else f"{attn_mask.dtype} {tuple(attn_mask.shape)}".replace("torch.", "")
            dtype = str(q.dtype).replace("torch.", "")
            flags = {"is_causal": bool(is_causal), "enable_gqa": bool(enable_gqa), "requires_grad": q.requires_grad}
            key = (role, dtype, mask.split(" ")[0], *flags.values(), q.shape[2] == 1)
            if key not in self.rows:  # detached copies; q, k, v keep whether they needed gradients
                self.rows[key] = {"role": role, "dtype": dtype, "mask": key[2], "mask_example": mask, **flags}
                self.rows[key].update(q_example=tuple(q.shape), k_example=tuple(k.shape), calls=0, backends={})
                self.samples[key] = tuple(
                    x.detach().clone().requires_grad_(x.requires_grad and x.is_floating_point())
                    if isinstance(x, torch.Tensor)
                    else x
                    for x in (q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)
                )
            self.rows[key]["calls"] += 1
            self.keys.append(key)
            with torch.profiler.record_function(f"sdpa_call#{len(self.keys) - 1}"):
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


def _descendants(evt: Any) -> Iterator[Any]:
    for child in getattr(evt, "cpu_children", None) or []:
        yield child
        yield from _descendants(child)


def attribute_backends(prof: Any, calls: list[dict[str, Any]]) -> None:
    """Fill ``backend`` (and ``kernels``) of every recorded call from the profile's events. With CUDA
    activity a call's range appears twice (the CPU range with the aten ops, and a ``gpu_user_annotation``
    without children): what either holds counts, so the second cannot overwrite the first."""
    found: dict[int, list[str]] = {i: [] for i in range(len(calls))}
    kernels: dict[int, set[str]] = {i: set() for i in range(len(calls))}
    for evt in prof.events():
        i = int(evt.name.split("#", 1)[1]) if evt.name.startswith("sdpa_call#") else len(calls)
        for child in _descendants(evt) if i < len(calls) else ():
            if backend := backend_of(child.name):
                found[i].append(backend)
            kernels[i].update(getattr(k, "name", str(k))[:120] for k in getattr(child, "kernels", None) or [])
    for i, call in enumerate(calls):
        call["backend"] = found[i][0] if found[i] else "unidentified"
        call["kernels"] = sorted(kernels[i])[:4]


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
            except Exception as err:  # torch warns why each kernel was refused, then raises "No available kernel"
                texts = (" ".join(str(w.message).split("(Triggered internally")[0].split()) for w in caught)
                why[name] = (" | ".join(dict.fromkeys(t for t in texts if t)) or " ".join(str(err).split()))[:400]
    return ok, why


def summarise_calls(rec: SdpaRecorder, prof: Any, device: torch.device) -> list[dict[str, Any]]:
    """One row per kind of call: count, the backends that ran (``used``) and their kernels, the
    backends it could use (``eligible``) and torch's reason for the others."""
    calls: list[dict[str, Any]] = [{} for _ in rec.keys]
    attribute_backends(prof, calls)
    kernels: dict[tuple, set[str]] = {}
    for key, c in zip(rec.keys, calls):
        backends = rec.rows[key]["backends"]
        backends[c["backend"]] = backends.get(c["backend"], 0) + 1
        kernels.setdefault(key, set()).update(c["kernels"])
    for key, row in rec.rows.items():
        row["kernels"] = sorted(kernels.get(key, ()))[:4]
        row["eligible"], row["not_eligible_because"] = eligible_backends(rec.samples[key], device)
        row["used"] = ", ".join(f"{b} x{n}" for b, n in row["backends"].items())
        row["eligible_shown"] = ", ".join(row["eligible"])
        why = [f"{b}: {w}" for b, w in row["not_eligible_because"].items() if b in ("flash", "efficient")]
        row["why"] = "; ".join(why)[:240]
    return list(rec.rows.values())


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
                loss = trainer.micro_loss(next(trainer.batches()))["loss"]
            else:  # a few steps are enough: every step after the first calls SDPA the same way
                trainer.model.eval()
                beam = 5 if phase == "beam decoding" else 1
                gen = GenerationConfig(strategy=phase.split()[0], beam_size=beam, max_len_a=0.0, max_len_b=6)
                with torch.inference_mode():
                    translate_sentences(trainer.model, src, gen, ctx.device)
            synchronize(ctx.device)
        rows = summarise_calls(rec, prof, ctx.device)
        if phase == "train forward":
            with profile(activities=activities) as prof_b:
                loss.backward()
                synchronize(ctx.device)
            ops = (e.name for e in prof_b.events() if e.name.startswith("aten::_") and "attention" in e.name)
            names = dict(Counter(name for name in ops if "backward" in name))
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
