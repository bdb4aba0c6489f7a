"""The repository's layout: a module holds one concept (docs/contributing.md, "How the code is laid
out"). Modules of functions stay small, no longer than :data:`MAX_LINES` lines as ``ruff format``
lays them out; a file that is one class may be longer (:data:`ONE_CLASS`, each with its reason),
since cutting a class along a line count scatters its attributes over files. Every test file that
the pages, the code and the scripts name exists, and ``tests/training/`` mirrors the rooms of
``transformer/training/``. The benchmarks use the package through its public API (no private name,
no module global set, no class patched) and import no benchmark as a library."""

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


def test_the_trainer_owns_the_update_and_its_parts_the_rest():
    """The Trainer keeps the update and the loop; the batches, the counters and clocks, validation
    and the training log are parts of their own in ``training/loop/`` (docs/contributing.md), so its
    file stays under 400 lines and holds no other class."""
    source = TRAINER_FILE.read_text(encoding="utf-8")
    assert len(source.splitlines()) < 400
    classes = [node.name for node in ast.parse(source).body if isinstance(node, ast.ClassDef)]
    assert classes == ["Trainer"]
    parts = {
        "batches.py": "TrainBatches",
        "state.py": "TrainState",
        "validation.py": "Validator",
        "train_log.py": "TrainLog",
    }
    for file, name in parts.items():
        tree = ast.parse((TRAINER_FILE.parent / file).read_text(encoding="utf-8"))
        assert name in {node.name for node in tree.body if isinstance(node, ast.ClassDef)}, file


BENCHMARKS = REPO_ROOT / "benchmarks"
THIRD_PARTY_PRIVATES = {
    "_dynamo": "torch._dynamo.reset() and its counters: torch's own way to drop compiled graphs between rows",
    "_attn_implementation": "a Hugging Face config field: the peer runs PyTorch's SDPA as ours does",
    "_experts_implementation": "a Hugging Face config field: which expert kernel the Mixtral peer runs",
}
"""The ``._name`` attributes a benchmark may read on another object, each with its reason (third-party
ones only: the package gives a benchmark a public hook where it needs one)."""
PACKAGE_WRITES: dict[tuple[str, str], str] = {}
"""``(file, name.attribute)`` of the benchmarks' writes to a name imported from the package, each with its reason."""


def _private_uses(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` of each ``x._name`` attribute (``x`` not ``self`` or ``cls``, the name not a
    dunder nor in :data:`THIRD_PARTY_PRIVATES`) and each import of a private name or module of the package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.endswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                if node.attr not in THIRD_PARTY_PRIVATES:
                    found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformer":
            names = [*node.module.split("."), *(a.name for a in node.names)]
            found += [(node.lineno, f"from {node.module} import {n}") for n in names if n.startswith("_")]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "transformer" and any(p.startswith("_") for p in a.name.split(".")):
                    found.append((node.lineno, f"import {a.name}"))
    return found


def _package_writes(source: str) -> list[tuple[int, str]]:
    """``(line, "name.attr")`` of each assignment (or ``setattr``) to an attribute of a name bound by an
    import from the package (a module, a class or a function of ``transformer``)."""
    tree = ast.parse(source)
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformer":
            imported |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            imported |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.split(".")[0] == "transformer"}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Assign):
            targets = [
                t for target in node.targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])
            ]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            name = node.args[1].value if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) else "?"
            targets = [ast.Attribute(value=node.args[0], attr=str(name), lineno=node.lineno)]
        for t in targets:
            root = t
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(t, ast.Attribute) and isinstance(root, ast.Name) and root.id in imported:
                found.append((node.lineno, f"{ast.unparse(t.value)}.{t.attr}"))
    return sorted(found)


def test_the_public_api_finders_see_private_uses_and_package_writes():
    source = (
        "from transformer.training.step import compiled\nfrom transformer.a import _b\nimport transformer._c\n"
        "import torch\ntrainer._loss(b)\nself._x = 1\nx.__class__\ntorch._dynamo.reset()\n"
        "compiled.BACKEND = 'eager'\nsetattr(compiled, 'BACKEND', 1)\ntorch.x = 1\ncompiled.a.b += 1\n"
    )
    assert _private_uses(source) == [
        (2, "from transformer.a import _b"),
        (3, "import transformer._c"),
        (5, "trainer._loss"),
    ]
    assert _package_writes(source) == [(9, "compiled.BACKEND"), (10, "compiled.BACKEND"), (12, "compiled.a.b")]


def test_benchmarks_use_the_package_through_its_public_api():
    """No benchmark calls a private method, reads a private attribute or imports a private name of
    the package, nor sets a module global or patches a class of it; a benchmark that needs more
    asks for a public hook. Third-party privates a peer or a compiled row needs are named, with
    their reasons, in :data:`THIRD_PARTY_PRIVATES`."""
    private, writes = [], []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        where = path.relative_to(REPO_ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        private += [f"{where}:{line}: {what}" for line, what in _private_uses(source)]
        writes += [f"{where}:{line}: {w}" for line, w in _package_writes(source) if (where, w) not in PACKAGE_WRITES]
    assert private == [], "private names used by the benchmarks: " + ", ".join(private)
    assert writes == [], "the benchmarks write to the package: " + ", ".join(writes)


def _benchmark_modules() -> dict[str, tuple[ast.Module, str]]:
    """``{"benchmarks.x.y": (tree, the package its relative imports start from)}`` of every module
    under ``benchmarks/`` (a package's ``__init__.py`` as the package)."""
    modules = {}
    for path in sorted(BENCHMARKS.rglob("*.py")):
        parts = path.relative_to(REPO_ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = name if parts[-1] == "__init__" else ".".join(parts[:-1])
        modules[name] = (ast.parse(path.read_text(encoding="utf-8")), package)
    return modules


def _imported_modules(tree: ast.Module, package: str, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``tree`` imports (``import benchmarks.x``, ``from benchmarks.x
    import y``, ``from benchmarks import x`` of a module, and relative imports from ``package``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            found |= {base} | {f"{base}.{a.name}" for a in node.names}
    return found & known


def test_no_benchmark_imports_another_as_a_library():
    """A module with a command line (``if __name__ == "__main__":``, or a package's ``__main__.py``) is
    a benchmark: no other module imports it. What benchmarks share lives in a library module
    (``benchmarks/__init__.py``, ``ab.py``, ``train_step.py``, ``peers.py``, ...)."""
    modules = _benchmark_modules()
    runnable = {
        name
        for name, (tree, _) in modules.items()
        if name.endswith(".__main__") or 'if __name__ == "__main__":' in ast.unparse(tree).replace("'", '"')
    }
    assert {"benchmarks.ab_runs", "benchmarks.gpu_check.__main__"} <= runnable and "benchmarks.ab" not in runnable
    imports = {name: _imported_modules(tree, package, set(modules)) for name, (tree, package) in modules.items()}
    assert {"benchmarks.ab", "benchmarks"} <= imports["benchmarks.ab_runs"]
    assert "benchmarks.gpu_check.report" in imports["benchmarks.gpu_check.realistic"]  # from .report import ...
    used = [f"{name} imports {other}" for name, found in imports.items() for other in sorted(found & runnable - {name})]
    assert used == [], "benchmarks imported as libraries (move what they share to a library module): " + ", ".join(used)
