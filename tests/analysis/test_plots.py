"""The plot writers of transformer.analysis.plots: one PNG writer behind every ``plot_*``."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer.analysis import plots


class _Figure:
    def __init__(self) -> None:
        self.saved: list[tuple[Path, int]] = []

    def savefig(self, path: Path, dpi: int) -> None:
        self.saved.append((path, dpi))


@pytest.mark.parametrize(
    "writer,figure",
    [
        ("plot_validation_curves", "validation_curves_figure"),
        ("plot_bleu_bars", "bleu_bars_figure"),
        ("plot_bleu_by_length", "bleu_by_length_figure"),
    ],
)
def test_every_plot_is_written_by_one_png_writer_at_120_dpi(monkeypatch, tmp_path, writer, figure) -> None:
    fig, written = _Figure(), []
    monkeypatch.setattr(plots, figure, lambda comparison: fig if comparison == "cmp" else None)
    real = plots._save_png
    monkeypatch.setattr(plots, "_save_png", lambda f, path: written.append(f) or real(f, path))
    out = getattr(plots, writer)("cmp", str(tmp_path / "a.png"))
    assert out == tmp_path / "a.png" and isinstance(out, Path)
    assert written == [fig] and fig.saved == [(tmp_path / "a.png", 120)]
