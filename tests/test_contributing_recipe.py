"""docs/contributing.md's worked example ("Adding a switch option") is executed as written: its steps 1
and 2 are applied to a copy of ``transformer/``, ``configs/`` and ``scripts/train.py``, and the new
option trains one update there with every example plugin loaded (a plugin that held the option's name
would stop the run: ``... is a built-in option already``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from safetensors import safe_open

from tests.conftest import REPO_ROOT
from tests.training.conftest import small_cli_args, small_corpus  # noqa: F401 (fixture)

GUIDE = REPO_ROOT / "docs" / "contributing.md"


def _recipe() -> dict[str, str]:
    """The worked example's option, its ``FFNS`` line and its YAML file, as the guide states them."""
    text = GUIDE.read_text(encoding="utf-8")
    section = text[text.index("## Adding a switch option") : text.index("## Adding a config field")]
    option = re.search(r"`model/ffn=(\w+)`", section)
    line = re.search(r"1\. `transformer/modules/ffn\.py`: one line in `FFNS`, `(.+?)`\.", section)
    yaml = re.search(r"2\. `configs/model/ffn/(\w+)\.yaml`: a copy of `(\w+\.yaml)` with `name: (\w+)`\.", section)
    assert option and line and yaml, "the worked example's steps 1 and 2 are no longer where this test reads them"
    return {
        "option": option.group(1),
        "line": line.group(1),
        "yaml": yaml.group(1),
        "copy_of": yaml.group(2),
        "name": yaml.group(3),
    }


def _apply(recipe: dict[str, str], root: Path) -> None:
    """Steps 1 and 2 of the guide on the copy under ``root``."""
    ffn = root / "transformer" / "modules" / "ffn.py"
    source = ffn.read_text(encoding="utf-8")
    start = "FFNS: dict[str, FFNChoice] = {\n"
    assert source.count(start) == 1, f"{ffn.name} has no FFNS table to add the line to"
    ffn.write_text(source.replace(start, start + "    " + recipe["line"] + "\n"), encoding="utf-8")
    folder = root / "configs" / "model" / "ffn"
    template = (folder / recipe["copy_of"]).read_text(encoding="utf-8")
    assert re.search(r"^name: \w+$", template, flags=re.M), f"{recipe['copy_of']} has no name line"
    (folder / f"{recipe['yaml']}.yaml").write_text(
        re.sub(r"^name: \w+$", f"name: {recipe['name']}", template, flags=re.M), encoding="utf-8"
    )


def test_the_recipe_names_one_new_option_that_no_plugin_holds() -> None:
    recipe = _recipe()
    assert recipe["option"] == recipe["yaml"] == recipe["name"] and recipe["line"].startswith(f'"{recipe["option"]}"')
    assert not (REPO_ROOT / "configs" / "model" / "ffn" / f"{recipe['yaml']}.yaml").exists(), "already built in"
    plugins = sorted(p.name for p in (REPO_ROOT / "examples" / "plugins").iterdir() if (p / "__init__.py").is_file())
    held = [
        p
        for p in plugins
        if f'"{recipe["option"]}"' in (REPO_ROOT / "examples" / "plugins" / p / "__init__.py").read_text()
        or (REPO_ROOT / "examples" / "plugins" / p / "configs" / "model" / "ffn" / f"{recipe['yaml']}.yaml").exists()
    ]
    assert held == [], f"model/ffn={recipe['option']} is an option of the example plugin(s) {held}"


def test_the_recipe_applied_to_a_copy_builds_and_trains_one_update(small_corpus, tmp_path) -> None:  # noqa: F811
    recipe = _recipe()
    root = tmp_path / "copy"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO_ROOT / "transformer", root / "transformer", ignore=ignore)
    shutil.copytree(REPO_ROOT / "configs", root / "configs", ignore=ignore)
    (root / "scripts").mkdir()
    shutil.copy(REPO_ROOT / "scripts" / "train.py", root / "scripts" / "train.py")
    _apply(recipe, root)
    run = tmp_path / "run"
    plugins = sorted(str(p) for p in (REPO_ROOT / "examples" / "plugins").iterdir() if (p / "__init__.py").is_file())
    args = small_cli_args(
        small_corpus,
        run,
        f"model/ffn={recipe['option']}",
        "train.max_updates=1",
        "train.validate_every=0",
        "train.valid_bleu=false",
        f"plugins=[{','.join(plugins)}]",
    )
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}  # the copy's package, not the checkout's
    check = subprocess.run(
        [sys.executable, "-c", "import transformer; print(transformer.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert check.stdout.strip() == str(root / "transformer" / "__init__.py"), check.stderr
    res = subprocess.run(
        [sys.executable, str(root / "scripts" / "train.py"), *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert results["config"]["model"]["ffn"]["name"] == recipe["option"] and results["updates"] == 1
    assert results["choices"]["model/ffn"] == recipe["option"]
    with safe_open(str(run / "checkpoint_last.safetensors"), "pt") as f:  # a gated block: w13 holds both halves
        w13 = f.get_tensor("encoder.layers.0.ffn.sublayer.w13.weight")
    assert w13.shape == (2 * 48, 32)  # hidden 2/3 of d_ff 64, rounded up to multiple_of 8, x 2; d_model 32
