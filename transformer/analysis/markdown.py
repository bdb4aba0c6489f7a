"""Markdown tables: the one writer of the comparison reports (``comparison.md``) and of every
benchmark's page (``benchmarks/``, ``docs/benchmarks/``).

A table is a header row, an alignment rule and body rows of cells; a cell is text that cannot break
the table (``|`` becomes ``/``), and a missing number is an empty cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def cell(value: Any, spec: str = "{}", limit: int | None = None) -> str:
    """One table cell: ``spec.format(value)`` (``""`` for None), ``|`` replaced by ``/``, cut to ``limit``
    characters."""
    if value is None:
        return ""
    text = spec.format(value).replace("|", "/")
    return text if limit is None else text[:limit]


def row(cells: Sequence[str]) -> str:
    """A table row: ``| a | b |`` (an empty cell is ``|  |``)."""
    return "| " + " | ".join(cells) + " |"


def rule(align: str) -> str:
    """The line under the header, one letter per column: ``l`` left (``---``), ``r`` right (``---:``).

    Raises:
        ValueError: a letter other than ``l`` or ``r``.
    """
    marks = {"l": "---", "r": "---:"}
    if set(align) - set(marks):
        raise ValueError(f"alignment {align!r}: one letter per column, l (left) or r (right)")
    return "|" + "|".join(marks[a] for a in align) + "|"


def table(header: Sequence[str], align: str, rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a table: header, rule and one line per row (a shorter row is padded).

    Raises:
        ValueError: ``align`` without one letter per column, or a row with more cells than the header.
    """
    if len(align) != len(header):
        raise ValueError(f"alignment {align!r} has {len(align)} columns, the header {len(header)}")
    lines = [row(header), rule(align)]
    for cells in rows:
        if len(cells) > len(header):
            raise ValueError(f"a row of {len(cells)} cells under a header of {len(header)}: {list(cells)}")
        lines.append(row([*cells, *[""] * (len(header) - len(cells))]))
    return lines
