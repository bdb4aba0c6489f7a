"""Every third-party module the code imports is installed by the README's install command.

The suite once passed on the machine where it was written only because packages had been installed
there by hand (``submitit``, ``hydra-submitit-launcher``); on a new machine ``pip install -e
".[dev]"`` did not bring them and CI failed. This test reads the imports of ``transformer/``,
``scripts/``, ``benchmarks/``, ``tests/`` and the notebooks' code cells with :mod:`ast` (module
level and inside functions, ``pytest.importorskip("x")`` and ``importlib.import_module("x")``
included), plus the Hydra plugins that configs, tests, the README and the pages under ``docs/`` select
(``hydra/launcher=joblib``), and fails naming the module and the file when no distribution that
provides it is listed in ``pyproject.toml``'s core dependencies or in the ``dev`` extra (what
``.ci/run`` installs). Optional imports that stand behind a clear "install the X extra" error are
listed in :data:`OPTIONAL` with the extra that provides them.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO_ROOT = Path(__file__).resolve().parents[1]
SOURCE_DIRS = ("transformer", "scripts", "benchmarks", "tests")

OPTIONAL: dict[str, tuple[str, str]] = {
    # module: (distribution, extra). Each import of these sits behind a one-line error naming the extra.
    "x_transformers": ("x-transformers", "bench"),  # benchmarks/peers.py: a peer of the throughput benchmark
}
"""Imports allowed outside core + dev: the distribution must then be listed in the named extra."""

INDIRECT: dict[str, str] = {
    "torch.utils.tensorboard": "tensorboard",  # torch's module imports the tensorboard distribution
}
"""Modules of a listed distribution that need another one, which is then needed too."""

PLUGINS: dict[tuple[str, str], str] = {
    ("launcher", "submitit_local"): "hydra-submitit-launcher",
    ("launcher", "submitit_slurm"): "hydra-submitit-launcher",
    ("launcher", "joblib"): "hydra-joblib-launcher",
    ("launcher", "ray"): "hydra-ray-launcher",
    ("launcher", "rq"): "hydra-rq-launcher",
    ("sweeper", "optuna"): "hydra-optuna-sweeper",
    ("sweeper", "ax"): "hydra-ax-sweeper",
    ("sweeper", "nevergrad"): "hydra-nevergrad-sweeper",
}
"""Hydra plugin options (``hydra/<group>=<name>``) and the distribution that provides each."""
_BUILTIN_PLUGINS = {("launcher", "basic"), ("sweeper", "basic")}


def canonical(name: str) -> str:
    """A distribution name as PEP 503 normalises it (``Hydra_Core`` -> ``hydra-core``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement_name(requirement: str) -> str:
    return canonical(re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement).group(1))


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """``(core + dev distributions, {extra: its distributions})`` from ``pyproject.toml``."""
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    extras = {name: {_requirement_name(r) for r in reqs} for name, reqs in project["optional-dependencies"].items()}
    installed_by_ci = {_requirement_name(r) for r in project["dependencies"]} | extras["dev"]
    return installed_by_ci, extras


def _first_party() -> set[str]:
    names = {"transformer", "tests", "hydra_plugins_local", "benchmarks"}
    for folder in SOURCE_DIRS:
        for path in (REPO_ROOT / folder).rglob("*.py"):
            names.add(path.stem)  # sibling modules of scripts/ and benchmarks/ (e.g. ``peers``)
    return names


def _imports_of(tree: ast.AST) -> list[str]:
    """Dotted names imported by ``tree`` (absolute imports only)."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("importorskip", "import_module") and isinstance(node.args[0].value, str):
                found.append(node.args[0].value)
    return found


def _sources() -> list[tuple[Path, str]]:
    """``(file, python source)`` for every .py file and every notebook's code cells."""
    out = []
    for folder in SOURCE_DIRS:
        out += [(p, p.read_text()) for p in sorted((REPO_ROOT / folder).rglob("*.py"))]
    for nb in sorted((REPO_ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        out.append((nb, "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))))
    return out


def third_party_imports(sources: list[tuple[Path, str]], first_party: set[str]) -> dict[str, list[str]]:
    """``{dotted module: [files importing it]}`` for every module outside the stdlib and this repo."""
    found: dict[str, list[str]] = {}
    for path, source in sources:
        where = str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else path.name
        for name in _imports_of(ast.parse(source, filename=str(path))):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top in first_party or top == "__future__":
                continue
            for key in {name, top}:  # the distribution is looked up by the top-level module
                found.setdefault(key, []).append(where)
    return found


def _distributions_of(top: str) -> set[str]:
    return {canonical(d) for d in importlib.metadata.packages_distributions().get(top, [])}


def undeclared(imports: dict[str, list[str]], installed_by_ci: set[str], extras: dict[str, set[str]]) -> list[str]:
    """One sentence per imported module that ``pip install -e ".[dev]"`` does not provide."""
    problems = []
    for name, files in sorted(imports.items()):
        top = name.split(".")[0]
        where = ", ".join(sorted(set(files))[:3])
        if top in OPTIONAL:
            dist, extra = OPTIONAL[top]
            if dist not in extras.get(extra, set()):
                problems.append(f"{top} ({where}) is optional but {dist} is not in the [{extra}] extra")
            continue
        if name in INDIRECT and INDIRECT[name] not in installed_by_ci:
            problems.append(
                f"{name} ({where}) needs {INDIRECT[name]}, which neither the core dependencies nor [dev] list"
            )
        if "." in name:
            continue  # the top-level module is checked on its own entry
        dists = _distributions_of(top)
        if not dists:
            problems.append(f"{top} ({where}) is not installed: no distribution provides it; list it in pyproject.toml")
        elif not dists & installed_by_ci:
            problems.append(
                f"{top} ({where}) comes from {', '.join(sorted(dists))}, which neither the core "
                "dependencies nor the [dev] extra of pyproject.toml list"
            )
    return problems


def test_every_imported_module_comes_from_a_declared_distribution():
    installed_by_ci, extras = declared()
    problems = undeclared(third_party_imports(_sources(), _first_party()), installed_by_ci, extras)
    assert not problems, 'imports not covered by `pip install -e ".[dev]"`:\n' + "\n".join(problems)


def test_the_check_names_an_undeclared_module_and_its_file(tmp_path):
    """The check itself fails on what it must catch (a test that cannot fail checks nothing)."""
    mod = tmp_path / "mod.py"
    mod.write_text("import numpy\nimport yaml\n\ndef f():\n    from definitely_not_installed_zzz.sub import x\n")
    found = third_party_imports([(mod, mod.read_text())], set())
    assert {"numpy", "yaml", "definitely_not_installed_zzz"} <= set(found)
    problems = undeclared(found, {"numpy"}, {"dev": set()})
    assert any(p.startswith("definitely_not_installed_zzz (mod.py) is not installed") for p in problems), problems
    assert any(p.startswith("yaml (mod.py) comes from pyyaml") for p in problems), problems  # only transitive
    assert not any(p.startswith("numpy") for p in problems)


def test_every_selected_hydra_plugin_is_installed_by_dev():
    installed_by_ci, _ = declared()
    pattern = re.compile(r"hydra/(launcher|sweeper)=([A-Za-z0-9_]+)")
    files = [
        REPO_ROOT / "README.md",
        *sorted((REPO_ROOT / "docs").rglob("*.md")),
        *(REPO_ROOT / "configs").rglob("*.yaml"),
        *(REPO_ROOT / "scripts").glob("*"),
        *(p for p, _ in _sources()),
    ]
    problems = []
    for path in files:
        if not path.is_file():
            continue
        for group, name in set(pattern.findall(path.read_text(errors="replace"))):
            if (group, name) in _BUILTIN_PLUGINS:
                continue
            dist = PLUGINS.get((group, name))
            where = path.relative_to(REPO_ROOT)
            if dist is None:
                problems.append(f"hydra/{group}={name} ({where}) is not a plugin this test knows: add it to PLUGINS")
            elif dist not in installed_by_ci:
                problems.append(f"hydra/{group}={name} ({where}) needs {dist}, which [dev] does not list")
    assert not problems, "\n".join(problems)


def test_ci_runs_the_readme_commands_verbatim_in_a_fresh_environment():
    ci = (REPO_ROOT / ".ci" / "run").read_text().splitlines()
    readme = (REPO_ROOT / "README.md").read_text().split("```")[1].splitlines()[1:]  # the first code block
    commands = [line for line in readme if line.strip()]
    assert commands and all(c in ci for c in commands), f".ci/run must run the README's {commands} verbatim"
    first = min(ci.index(c) for c in commands)
    assert any("-m venv" in line for line in ci[:first]), ".ci/run must create a fresh venv before installing"
    assert any(line.startswith(("source ", ". ")) and "bin/activate" in line for line in ci[:first])
