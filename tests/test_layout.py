"""The repository's layout: a module holds one concept (docs/contributing.md, "How the code is laid
out"). Modules of functions stay small, no longer than :data:`MAX_LINES` lines as ``ruff format``
lays them out; a file that is one class may be longer (:data:`ONE_CLASS`, each with its reason),
since cutting a class along a line count scatters its attributes over files. Every test file that
the pages, the code and the scripts name exists, and ``tests/training/`` mirrors the rooms of
``transformer/training/``."""

import ast
import re

from tests.conftest import REPO_ROOT

MAX_LINES = 500  # lines in the formatter's layout (ruff format writes long calls vertically)
FOLDERS = ("transformer", "benchmarks")
ONE_CLASS = {
    "transformer/training/loop/trainer.py": "the Trainer: its step, loop, validation round and own state",
}
"""Files that may pass :data:`MAX_LINES`: one public class each, with the reason it stays whole."""
TRAINING_ROOT_TESTS = {
    "test_stopping.py": "stopping.py",
    "test_optuna_sweep.py": "command.py",  # the Hydra task's return value is the sweep's objective
}
"""The test files at the root of ``tests/training/``, each with the root module of
``transformer/training/`` it tests; every other one sits in the folder of its sub-package."""


def _line_counts() -> dict[str, int]:
    """``{path relative to the repository: lines}`` of every ``.py`` file under :data:`FOLDERS`."""
    return {
        path.relative_to(REPO_ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for folder in FOLDERS
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
    }


def test_the_counter_sees_the_files():
    counts = _line_counts()
    assert {
        "transformer/config/schema.py",
        "transformer/training/loop/trainer.py",
        "benchmarks/gpu_check/cli.py",
    } <= set(counts)
    assert all(n > 0 for n in counts.values())


def test_no_file_is_longer_than_the_limit():
    long = {path: n for path, n in _line_counts().items() if n > MAX_LINES and path not in ONE_CLASS}
    assert long == {}, f"files over {MAX_LINES} lines (split them along a seam): " + ", ".join(
        f"{path} ({n})" for path, n in sorted(long.items(), key=lambda item: -item[1])
    )


def test_every_test_file_named_exists():
    named: dict[str, set[str]] = {}
    files = [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").rglob("*.md")]
    for folder, pattern in (
        ("transformer", "*.py"),
        ("benchmarks", "*.py"),
        ("scripts", "*"),
        ("tests", "*.py"),
        ("configs", "*.yaml"),
        ("examples", "*"),
    ):
        files += [p for p in (REPO_ROOT / folder).rglob(pattern) if p.is_file()]
    for path in files:
        for name in re.findall(r"tests/[\w/]+\.py", path.read_text(encoding="utf-8", errors="replace")):
            named.setdefault(name, set()).add(path.relative_to(REPO_ROOT).as_posix())
    assert "tests/benchmarks/test_gpu_check.py" in named
    missing = {name: sorted(where) for name, where in named.items() if not (REPO_ROOT / name).is_file()}
    assert missing == {}, f"test files named but not there: {missing}"


def test_a_longer_file_is_one_class():
    for path in ONE_CLASS:
        tree = ast.parse((REPO_ROOT / path).read_text(encoding="utf-8"))
        classes = [n.name for n in tree.body if isinstance(n, ast.ClassDef) and not n.name.startswith("_")]
        functions = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
        assert len(classes) == 1 and not functions, f"{path}: classes {classes}, functions {functions}"


def test_training_tests_mirror_the_training_package():
    """Each test file under ``tests/training/`` sits in a folder named after the sub-package of
    ``transformer/training/`` it tests (``step/``, ``loop/``, ...), a package of its own, or at the root
    for a root module (:data:`TRAINING_ROOT_TESTS`); helpers (``conftest.py``, ``rank_probe.py``) may
    sit anywhere."""
    package, tests = REPO_ROOT / "transformer" / "training", REPO_ROOT / "tests" / "training"
    sub_packages = {path.parent.name for path in package.glob("*/__init__.py")}
    folders = {path.name for path in tests.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert folders <= sub_packages, f"tests/training/ folders without a sub-package: {sorted(folders - sub_packages)}"
    assert all((tests / folder / "__init__.py").is_file() for folder in folders | {"."})
    misplaced = []
    for path in sorted(tests.rglob("test_*.py")):
        parts = path.relative_to(tests).parts
        if len(parts) == 1:
            module = TRAINING_ROOT_TESTS.get(parts[0])
            if module is None or not (package / module).is_file():
                misplaced.append(f"{parts[0]} (at the root, testing no root module of TRAINING_ROOT_TESTS)")
        elif len(parts) > 2:
            misplaced.append("/".join(parts))
    assert misplaced == [], "tests/training/ files not where their module is: " + ", ".join(misplaced)
    assert all((tests / name).is_file() for name in TRAINING_ROOT_TESTS), "TRAINING_ROOT_TESTS names a file not there"


TRAINER_FILE = REPO_ROOT / "transformer" / "training" / "loop" / "trainer.py"


def _trainer_attribute_writes(source: str) -> list[tuple[int, str]]:
    """``(line, "trainer.attr")`` of each assignment to an attribute of a name ending in ``trainer``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if not isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            continue
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id.endswith("trainer"):
                    found.append((t.lineno, f"{t.value.id}.{t.attr}"))
    return found


def test_the_trainer_writer_finder_sees_assignments():
    assert _trainer_attribute_writes("trainer.log = f\nx.trainer = 1\nself.trainer.a = 2\ntrainer.n += 1") == [
        (1, "trainer.log"),
        (4, "trainer.n"),
    ]


def test_no_module_outside_the_trainer_writes_its_attributes():
    """The Trainer's collaborators come in through its constructor and ``fit``; no caller in the
    package, the scripts or the benchmarks writes a Trainer attribute."""
    writes = [
        f"{path.relative_to(REPO_ROOT)}:{line}: {what}"
        for folder in ("transformer", "scripts", "benchmarks")
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        if path != TRAINER_FILE
        for line, what in _trainer_attribute_writes(path.read_text(encoding="utf-8"))
    ]
    assert writes == []
