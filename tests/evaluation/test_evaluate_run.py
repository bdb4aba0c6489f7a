"""transformer.evaluation.command (the work of scripts/evaluate.py), called in-process: files mode on
small files, checkpoint mode on a tiny run folder (tests/generation/helpers.make_run_dir) with the
Multi30k test split from ../shared/data (skipped without it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.generation.helpers import compose_script_config, make_run_dir, shared_data_dir
from transformer.config import ConfigError, GenerationConfig
from transformer.data.corpus import read_lines
from transformer.evaluation import corpus_scores
from transformer.evaluation.command import evaluate, evaluate_checkpoint, score_files
from transformer.generation import detokenize, translate_sentences

REFS = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Ein Mädchen lächelt."]


def _cfg(*overrides: str):
    return compose_script_config("evaluate", ["progress=false", *overrides])


@pytest.fixture
def files(tmp_path) -> tuple[Path, Path, Path]:
    """``(refs, a worse system, the references themselves)``."""
    refs, worse, same = tmp_path / "ref.de", tmp_path / "worse.de", tmp_path / "same.de"
    refs.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    same.write_text("\n".join(REFS) + "\n", encoding="utf-8")
    worse.write_text("Ein Mann.\nZwei Hunde.\nEin Kind lacht.\n", encoding="utf-8")
    return refs, worse, same


def test_one_file_is_scored_without_a_bootstrap(files, capsys):
    refs, worse, _ = files
    res = score_files(_cfg(f"refs={refs}", f"hyps={worse}"))
    assert list(res) == ["scores"]
    assert res["scores"][str(worse)] == corpus_scores(read_lines(worse), REFS)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{worse}: BLEU ") and out[1].startswith("BLEU|") and out[2].startswith("chrF2|")


def test_several_files_are_bootstrapped_against_the_first_and_saved(files, tmp_path, capsys):
    refs, worse, same = files
    res = evaluate(
        _cfg(f"refs={refs}", f"hyps=[{worse},{same}]", "bootstrap_samples=50", f"output_dir={tmp_path / 'out'}")
    )  # no checkpoint: files mode
    assert list(res["bootstrap"]) == ["baseline", str(same)]  # the first file is the baseline
    assert res["bootstrap"]["baseline"]["bleu"] == pytest.approx(res["scores"][str(worse)]["bleu"])
    assert res["bootstrap"][str(same)]["bleu"] == pytest.approx(100.0)
    assert json.loads((tmp_path / "out" / "results.json").read_text()) == json.loads(json.dumps(res))
    assert "paired bootstrap resampling (sacreBLEU), baseline first:" in capsys.readouterr().out


def test_files_mode_errors(files, tmp_path):
    refs, worse, _ = files
    with pytest.raises(ConfigError, match="give checkpoint=PATH, or refs=FILE"):
        score_files(_cfg(f"hyps={worse}"))
    short = tmp_path / "short.de"
    short.write_text("Ein Mann.\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"has 1 lines but .*ref\.de has 3: the lines must pair up"):
        score_files(_cfg(f"refs={refs}", f"hyps=[{worse},{short}]"))
    with pytest.raises(FileNotFoundError, match=r"file not found: .*missing\.de"):
        score_files(_cfg(f"refs={refs}", f"hyps={tmp_path / 'missing.de'}"))


def test_the_metrics_package_does_not_load_models():
    """``transformer.evaluation`` stays metrics only (docs/contributing.md's import order); ``.run`` is imported by name."""
    code = (
        "import sys, transformer.evaluation; print(sorted(m for m in sys.modules "
        "if m.startswith(('transformer.generation', 'transformer.evaluation.command', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def data_root() -> Path:
    d = shared_data_dir()
    if not (d / "multi30k" / "test_2016_flickr.en.gz").is_file():
        pytest.skip(f"Multi30k not found under {d}; set TRANSFORMER_DATA_DIR")
    return d


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("evaluate_run") / "run")


def test_a_checkpoint_is_scored_on_what_it_translates(run, data_root, capsys):
    """The hypotheses are the model's greedy translations of the split, and BLEU is theirs against
    the raw references; results go to <run>/eval/checkpoint_best/."""
    run_dir, model, src_tok, tgt_tok = run
    res = evaluate_checkpoint(
        _cfg(
            f"checkpoint={run_dir}",
            "splits=[test_2016_flickr]",
            "limit=8",
            f"data.root={data_root}",
            "generation.strategy=greedy",
        )
    )
    src = read_lines(data_root / "multi30k" / "test_2016_flickr.en.gz")[:8]
    refs = read_lines(data_root / "multi30k" / "test_2016_flickr.de.gz")[:8]
    gen = GenerationConfig(strategy="greedy", max_len_a=1.0, max_len_b=5)
    hyps = detokenize(translate_sentences(model, [src_tok.encode(s) for s in src], gen, "cpu"), tgt_tok)
    out_dir = run_dir / "eval" / "checkpoint_best"
    assert (out_dir / "test_2016_flickr.txt").read_text(encoding="utf-8").split("\n")[:-1] == hyps
    s = res["splits"]["test_2016_flickr"]
    assert s["bleu"] == corpus_scores(hyps, refs)["bleu"] and s["sentences"] == 8 and s["failed_lines"] == []
    assert res["checkpoint"] == str(run_dir / "checkpoint_best.safetensors")
    assert res["generation"]["strategy"] == "greedy"
    assert json.loads((out_dir / "results.json").read_text())["splits"]["test_2016_flickr"]["bleu"] == s["bleu"]
    out = capsys.readouterr()
    assert out.out.splitlines()[0] == f"{run_dir / 'checkpoint_best.safetensors'} (encoder_decoder, en->de, greedy)"
    assert out.out.splitlines()[1].startswith("test_2016_flickr: BLEU ")
    assert out.err.strip().endswith(f"wrote {out_dir / 'results.json'}")


def test_checkpoint_mode_refuses_what_it_cannot_do(run, data_root, tmp_path):
    run_dir = run[0]
    with pytest.raises(ConfigError, match="baseline=FILE compares one split, but 2 are requested"):
        evaluate_checkpoint(
            _cfg(
                f"checkpoint={run_dir}",
                "splits=[test_2016_flickr,test_2017_flickr]",
                f"baseline={tmp_path / 'base.txt'}",
                f"data.root={data_root}",
                f"output_dir={tmp_path / 'e'}",
            )
        )
    short = tmp_path / "base.txt"
    short.write_text("eins\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"baseline .*base\.txt has 1 lines but test_2016_flickr has 4"):
        evaluate_checkpoint(
            _cfg(
                f"checkpoint={run_dir}",
                "splits=[test_2016_flickr]",
                "limit=4",
                f"baseline={short}",
                f"data.root={data_root}",
                "generation.strategy=greedy",
                f"output_dir={tmp_path / 'e'}",
            )
        )


@pytest.fixture
def small_data(data_root, tmp_path) -> Path:
    """A data root whose test_2016_flickr is the first 8 pairs of the real one (whole splits, fast)."""
    import gzip

    folder = tmp_path / "data" / "multi30k"
    folder.mkdir(parents=True)
    for lang in ("en", "de"):
        lines = read_lines(data_root / "multi30k" / f"test_2016_flickr.{lang}.gz")[:8]
        with gzip.open(folder / f"test_2016_flickr.{lang}.gz", "wt", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    return tmp_path / "data"


def test_a_test_time_rope_scaling_gets_its_own_folder_and_reads_as_a_run_in_compare(small_data, tmp_path, capsys):
    """``model.position.rope_scaling.*`` on evaluate's command line: the hypotheses are those of the
    model built with that scaling (the run's weights), in ``eval/<checkpoint>+<tag>/`` beside the
    plain evaluation; ``results.json`` records the overrides, the model as evaluated and the
    training run's facts, so :func:`transformer.analysis.load_run` reads the folder as a run of a
    configuration named by the scaling, which compare.py never takes as the default baseline."""
    from tests.conftest import tiny_model_config
    from transformer.analysis import compare_sweeps, load_run
    from transformer.analysis.grouping import group_runs
    from transformer.models import build_model

    run_dir, model, tok, _ = make_run_dir(tmp_path / "run", position__name="rope")
    trained = {
        "bleu": 1.0,
        "test_split": "test_2016_flickr",
        "params": 1234,
        "precision": "fp32",
        "choices": {"ladder": "step5_gqa", "model/position": "rope"},
        "config": {"seed": 1},
    }
    (run_dir / "results.json").write_text(json.dumps(trained))
    scaling = [
        "model.position.rope_scaling.rope_type=dynamic",
        "model.position.rope_scaling.factor=2",
        "model.position.rope_scaling.original_max_position_embeddings=4",
    ]
    common = [
        f"checkpoint={run_dir}",
        "splits=[test_2016_flickr]",
        f"data.root={small_data}",
        "generation.strategy=greedy",
    ]
    res = evaluate_checkpoint(_cfg(*common, *scaling))
    plain = evaluate_checkpoint(_cfg(*common))

    out_dir = run_dir / "eval" / "checkpoint_best+rope_dynamic_x2_L0=4"
    reference = build_model(
        tiny_model_config(
            position__name="rope",
            **{
                "position.rope_scaling.rope_type": "dynamic",
                "position.rope_scaling.factor": 2.0,
                "position.rope_scaling.original_max_position_embeddings": 4,
            },
        ),
        len(tok),
    ).eval()
    reference.load_state_dict(model.state_dict())
    src = read_lines(small_data / "multi30k" / "test_2016_flickr.en.gz")
    gen = GenerationConfig(strategy="greedy", max_len_a=1.0, max_len_b=5)
    hyps = detokenize(translate_sentences(reference, [tok.encode(s) for s in src], gen, "cpu"), tok)
    assert (out_dir / "test_2016_flickr.txt").read_text(encoding="utf-8").split("\n")[:-1] == hyps
    assert (run_dir / "eval" / "checkpoint_best" / "test_2016_flickr.txt").is_file()  # the plain one beside it
    assert res["test_time"] == [
        "model.position.rope_scaling.rope_type=dynamic",
        "model.position.rope_scaling.factor=2.0",
        "model.position.rope_scaling.original_max_position_embeddings=4",
    ]
    assert plain["test_time"] == [] and res["limit"] == 0
    assert res["config"]["model"]["position"]["rope_scaling"]["rope_type"] == "dynamic"
    assert res["config"]["generation"]["strategy"] == "greedy"  # the settings it was evaluated with
    assert res["trained"] == {
        "params": 1234,
        "precision": "fp32",
        "choices": {"ladder": "step5_gqa", "model/position": "rope"},
    }
    assert "  at test time: model.position.rope_scaling.rope_type=dynamic" in capsys.readouterr().out

    scaled_run, plain_run = load_run(out_dir), load_run(run_dir / "eval" / "checkpoint_best")
    assert scaled_run.ok and scaled_run.evaluation and scaled_run.reason is None
    assert (
        scaled_run.test_split == "test_2016_flickr"
        and scaled_run.results["bleu"] == res["splits"]["test_2016_flickr"]["bleu"]
    )
    assert scaled_run.hyps_path() == out_dir / "test_2016_flickr.txt"
    assert scaled_run.results["params"] == 1234 and scaled_run.choices["model/position"] == "rope"
    assert scaled_run.test_time == res["test_time"] and plain_run.test_time == []
    configs, _ = group_runs([plain_run, scaled_run])
    assert [c.label for c in configs] == ["step5_gqa", "step5_gqa + rope_dynamic_x2_L0=4 at test time"]

    sweep = tmp_path / "sweep"  # the scaled folder sorts first; the baseline is still the run as trained
    evaluate_checkpoint(_cfg(*common, *scaling, f"output_dir={sweep / 'a_dynamic'}"))
    evaluate_checkpoint(_cfg(*common, f"output_dir={sweep / 'b_plain'}"))
    comparison = compare_sweeps([sweep], n_bootstrap=20)
    assert comparison.baseline == "step5_gqa"
    assert [r["bleu_mean"] for r in comparison.rows] == [
        res["splits"]["test_2016_flickr"]["bleu"],
        plain["splits"]["test_2016_flickr"]["bleu"],
    ]
    evaluate_checkpoint(_cfg(*common, f"output_dir={sweep / 'c_plain_again'}"))  # one run's seed, evaluated twice
    with pytest.raises(
        ValueError,
        match=r"'step5_gqa' has seed 1 2 times \(b_plain, c_plain_again\): a row holds "
        r"one run per seed",
    ):
        compare_sweeps([sweep], n_bootstrap=0)

    limited = evaluate_checkpoint(_cfg(*common, "limit=3", f"output_dir={tmp_path / 'limited'}"))
    assert limited["limit"] == 3 and limited["splits"]["test_2016_flickr"]["sentences"] == 3
    assert not load_run(tmp_path / "limited").ok and "first 3 sentences" in load_run(tmp_path / "limited").reason
    ensemble = tmp_path / "ensemble"  # an ensemble's folder has no single config: listed with the reason
    ensemble.mkdir()
    (ensemble / "results.json").write_text(json.dumps({"checkpoint": ["a", "b"], "splits": {"t": {"bleu": 3.0}}}))
    assert not load_run(ensemble).ok and "evaluate.py folder without the model's config" in load_run(ensemble).reason


def test_a_bad_split_stops_an_evaluation_before_it_writes_anything(run, data_root, tmp_path):
    """The files of every split are found before any translation: an unknown split after a good one
    leaves an earlier evaluation in the output folder as it was."""
    from transformer.data.corpus import DataError

    run_dir = run[0]
    out = tmp_path / "e"
    first = evaluate_checkpoint(
        _cfg(
            f"checkpoint={run_dir}",
            "splits=[test_2016_flickr]",
            "limit=4",
            f"data.root={data_root}",
            "generation.strategy=greedy",
            f"output_dir={out}",
        )
    )
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(DataError, match="split 'nosuch' is not available"):
        evaluate_checkpoint(
            _cfg(
                f"checkpoint={run_dir}",
                "splits=[test_2016_flickr,nosuch]",
                "limit=2",
                f"data.root={data_root}",
                "generation.strategy=greedy",
                f"output_dir={out}",
            )
        )
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and first["limit"] == 4
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        evaluate_checkpoint(
            _cfg(
                f"checkpoint={run_dir}",
                "splits=[test_2016_flickr]",
                "limit=2",
                f"baseline={tmp_path / 'missing.txt'}",
                f"data.root={data_root}",
                "generation.strategy=greedy",
                f"output_dir={tmp_path / 'never'}",
            )
        )
    assert not (tmp_path / "never").exists()
