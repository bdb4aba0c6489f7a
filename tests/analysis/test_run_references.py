"""A run folder carries the references its test hypotheses were scored against (``hyps/<split>.ref``):
``compare.py`` reads them from the folder, not from the data (which may not be on the machine)."""

from __future__ import annotations

import shutil

import pytest
from omegaconf import OmegaConf

from tests.faults.conftest import gappy_corpus, small_corpus, trained_run  # noqa: F401 (fixtures)
from transformer.analysis import stats
from transformer.analysis.collect import load_run
from transformer.data.corpus import read_parallel, resolve_split_files


def test_a_run_stores_the_references_of_its_hypotheses_and_compare_reads_them(trained_run, tmp_path, monkeypatch):  # noqa: F811
    run = load_run(shutil.copytree(trained_run, tmp_path / "run"))
    assert run.refs_path() == run.run_dir / "hyps" / f"{run.test_split}.ref"
    src, tgt = resolve_split_files(OmegaConf.create(run.config["data"]), run.test_split, download=False)
    scored = read_parallel(src, tgt, keep_empty=True)[1]  # every line, the one with an empty source too
    hyps = run.hyps_path().read_text(encoding="utf-8").splitlines()
    assert run.refs_path().read_text(encoding="utf-8") == "".join(r + "\n" for r in scored)
    assert len(hyps) == len(scored)

    def nowhere(*args, **kwargs):
        raise AssertionError("the data was read: the run folder's references were not used")

    with monkeypatch.context() as patch:
        patch.setattr(stats, "resolve_split_files", nowhere)
        stats._SPLIT_CACHE.clear()
        assert stats.references(run) == scored
        run.refs_path().unlink()  # a folder trained before runs stored them: the data is read
        with pytest.raises(AssertionError, match="the data was read"):
            stats.references(run)
    assert stats.references(run) == scored  # from the data: line-aligned with the hypotheses too
