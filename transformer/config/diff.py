"""Field-by-field comparison of two configs (plain nested dicts), for resume and checkpoint checks."""

from __future__ import annotations

from typing import Any

__all__ = ["config_differences"]

_ABSENT = object()


def config_differences(a: Any, b: Any, *, common_only: bool = False, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """The leaves where two nested configs differ.

    Args:
        a, b: plain configs (nested dicts; e.g. ``OmegaConf.to_container(cfg, resolve=True)``).
        common_only: compare only keys present in both (e.g. a record written before a field was
            added); otherwise a key missing on one side counts as a difference (value None there).
        prefix: prepended to every key (used by the recursion).

    Returns:
        ``[(dotted key, value in a, value in b), ...]`` in ``a``'s key order, then ``b``'s extra keys.
    """
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in list(a) + [k for k in b if k not in a]:
            va, vb = a.get(k, _ABSENT), b.get(k, _ABSENT)
            if _ABSENT in (va, vb):
                if not common_only:
                    out.append((f"{prefix}{k}", None if va is _ABSENT else va, None if vb is _ABSENT else vb))
                continue
            out += config_differences(va, vb, common_only=common_only, prefix=f"{prefix}{k}.")
        return out
    if isinstance(a, tuple) or isinstance(b, tuple):  # YAML has lists only
        a, b = list(a) if isinstance(a, tuple) else a, list(b) if isinstance(b, tuple) else b
    return [] if a == b else [(prefix.rstrip("."), a, b)]
