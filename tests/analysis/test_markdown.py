"""The one Markdown table writer (``transformer.analysis.markdown``)."""

from __future__ import annotations

import pytest

from transformer.analysis.markdown import cell, row, rule, table


def test_a_table_is_header_rule_and_rows_with_short_rows_padded():
    lines = table(
        ["model", "tok/s", "ratio"], "lrr", [["ours", cell(1234.5, "{:,.0f}"), cell(1.0, "{:.2f}x")], ["peer"]]
    )
    assert lines == [
        "| model | tok/s | ratio |",
        "|---|---:|---:|",
        "| ours | 1,234 | 1.00x |",
        "| peer |  |  |",
    ]


def test_a_cell_cannot_break_its_table_and_a_missing_number_is_empty():
    assert cell(None, "{:.2f}") == ""
    assert cell("a | b", limit=3) == "a /"
    assert row(["", "x"]) == "|  | x |"
    assert rule("lr") == "|---|---:|"


def test_a_table_whose_sizes_disagree_is_refused():
    with pytest.raises(ValueError, match="alignment 'lr' has 2 columns, the header 3"):
        table(["a", "b", "c"], "lr", [])
    with pytest.raises(ValueError, match="a row of 3 cells under a header of 2"):
        table(["a", "b"], "lr", [["1", "2", "3"]])
    with pytest.raises(ValueError, match="one letter per column, l .left. or r .right."):
        rule("lc")
