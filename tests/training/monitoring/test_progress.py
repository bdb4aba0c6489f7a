"""The training bar: a total and an ETA when the run has a budget, from the
resumed position."""

from __future__ import annotations

import io

from transformer.training.monitoring.progress import TrainingBar


def _bar(**kw) -> tuple[TrainingBar, io.StringIO]:
    out = io.StringIO()
    args = dict(max_updates=0, max_time=0.0, update=0, train_time=0.0, desc="train fp32", enabled=True)
    args.update(kw)
    return TrainingBar(**args, file=out), out


def test_an_update_budget_gives_total_eta_and_the_resumed_position():
    bar, out = _bar(max_updates=6000, update=4000)
    bar.step(0.5, 4001, loss="3.000")
    bar.bar.refresh()
    text = out.getvalue()
    assert bar.bar.total == 6000 and bar.bar.n == 4001
    assert "4001/6000" in text and "<" in text and "loss=3.000" in text  # [elapsed<remaining]
    bar.close()
    bar.close()  # idempotent


def test_a_time_budget_is_shown_as_time_with_the_update_in_the_postfix():
    bar, out = _bar(max_time=1380.0, train_time=600.0, update=300)
    bar.step(2.0, 301, loss="4.000")
    bar.bar.refresh()
    assert bar.bar.total == 1380.0 and bar.bar.n == 602.0
    text = out.getvalue()
    assert "602/1380s" in text and "upd=301" in text
    bar.step(10_000.0, 302)  # never past the budget
    assert bar.bar.n == 1380.0


def test_no_budget_counts_updates_and_disabled_draws_nothing():
    bar, _ = _bar(max_updates=0, max_time=0.0, update=7)
    assert bar.bar.total is None and bar.bar.n == 7
    off, out = _bar(max_updates=10, enabled=False)
    off.step(1.0, 1)
    off.close()
    assert off.bar is None and out.getvalue() == ""
