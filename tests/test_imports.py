"""The package's import structure: every module imports on its own, no module imports another
inside a function, the graph of internal imports has no cycle, and it is the import
order ``docs/contributing.md`` states."""

import ast
import importlib
import importlib.util
import pkgutil
import re
import subprocess
import sys
import types
from pathlib import Path

import transformer
from tests.conftest import REPO_ROOT

PACKAGE = Path(transformer.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> file (packages by their ``__init__.py``)."""
    found = {"transformer": PACKAGE / "__init__.py"}
    for info in pkgutil.walk_packages([str(PACKAGE)], prefix="transformer."):
        rel = Path(*info.name.split(".")[1:])
        found[info.name] = PACKAGE / rel / "__init__.py" if info.ispkg else PACKAGE / rel.with_suffix(".py")
    return found


def _imported(node: ast.Import | ast.ImportFrom, name: str, is_package: bool, modules: dict[str, Path]) -> set[str]:
    """The package's modules that one import statement of module ``name`` loads: the module it
    names (``from a import b`` names ``a.b`` when that is a module, else ``a``) and the packages
    above it that Python initialises first, except those ``name`` itself lies in (already
    initialised when ``name`` runs)."""
    if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative import
            parts = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
            base = ".".join(parts + ([base] if base else []))
        targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)} | ({name} if is_package else set())
    loaded = set()
    for t in targets:
        parts = t.split(".")
        loaded |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return {t for t in loaded if t in modules and t not in own}


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    """Module -> the package's modules it imports (anywhere in the file, ``if TYPE_CHECKING:``
    blocks excluded), and the imports found inside functions (``file:line``)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    inside: list[str] = []
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for stmt in block.body
            for n in ast.walk(stmt)
        }
        in_functions = {
            id(n)
            for fn in ast.walk(tree)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            for n in ast.walk(fn)
        }
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                found = _imported(node, name, path.name == "__init__.py", modules)
                edges |= found
                if found and id(node) in in_functions:
                    inside.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
        graph[name] = edges - {name}
    return graph, inside


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def _package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph folded onto the package's top-level packages and modules (``config``,
    ``io``, ...): which of them the modules of each import (``transformer`` itself left out)."""

    def top(module: str) -> str:
        return module.split(".")[1] if "." in module else ""

    folded: dict[str, set[str]] = {}
    for module, imports in graph.items():
        if top(module):
            folded.setdefault(top(module), set()).update(top(m) for m in imports if top(m) != top(module))
    return folded


def _stated_order() -> list[tuple[str, set[str]]]:
    """The section "The import order" of ``docs/contributing.md``, in its order: each line
    "- `<package>` imports `<a>`, `<b>`" (or "imports nothing from the package") as ``(package, {a, b})``."""
    text = (REPO_ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    section = text.split("\n## The import order\n", 1)[1].split("\n## ", 1)[0]
    stated = []
    for line in section.splitlines():
        if m := re.fullmatch(r"- `(\w+)` imports (nothing from the package|.+)", line.strip()):
            imports = set() if m.group(2).startswith("nothing") else set(re.findall(r"`(\w+)`", m.group(2)))
            stated.append((m.group(1), imports))
    return stated


def test_the_graph_finder_sees_every_module_and_a_known_edge():
    graph, _ = _graph()
    assert {"transformer.models.builder", "transformer.kernels.rotary", "transformer.training.loop.trainer"} <= set(
        graph
    )
    assert "transformer.kernels.rotary" in graph["transformer.modules.attention"]
    assert "transformer.config" in graph["transformer.models.builder"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_import_order_the_docs_state_is_the_import_graph():
    graph = _graph()[0]
    stated = _stated_order()
    names = [package for package, _ in stated]
    assert len(names) == len(set(names)) and names, names
    real = _package_graph(graph)
    assert set(names) == set(real), (
        f"packages the page lists but the package lacks: {set(names) - set(real)}; unlisted: {set(real) - set(names)}"
    )
    for package, imports in stated:
        assert imports == real[package], (
            f"docs/contributing.md says `{package}` imports {sorted(imports)}; it imports {sorted(real[package])}"
        )
    for i, (package, imports) in enumerate(stated):
        below = imports - set(names[:i])
        assert not below, f"`{package}` imports {sorted(below)}, listed below it"
    assert graph["transformer"] == set()


def test_the_package_has_no_import_cycles():
    cycle = _cycle(_graph()[0])
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_module_imports_the_package_inside_a_function():
    _, inside = _graph()
    assert inside == [], "internal imports inside functions (move them to the top of the file): " + ", ".join(inside)


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(_modules(), reverse=True)  # submodules before their packages: none relies on import order
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    proc = subprocess.run(
        [sys.executable, "-c", code, *names], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_every_name_a_module_exports_exists():
    """``from transformer.<module> import *`` works: each name in a module's ``__all__`` is defined
    there (a package's ``__all__`` that gathers its submodules' lists must import every name)."""
    missing = [
        f"{name}.{attr}"
        for name in sorted(_modules())
        for attr in getattr(importlib.import_module(name), "__all__", ())
        if not hasattr(importlib.import_module(name), attr)
    ]
    assert missing == [], "names in __all__ that the module does not define: " + ", ".join(missing)


def test_no_exported_name_turns_into_a_submodule():
    """Once every module is imported, each package's ``__all__`` names its objects, not submodules:
    Python sets a package's attribute to a submodule of the same name when that is imported, which a
    lazily exported name (``__getattr__``) of that name can never win back."""
    modules = {name: importlib.import_module(name) for name in sorted(_modules())}
    clashes = [
        f"{name}.{attr}"
        for name, module in modules.items()
        for attr in getattr(module, "__all__", ())
        if isinstance(getattr(module, attr, None), types.ModuleType)
    ]
    assert clashes == [], "exported names that are submodules: " + ", ".join(clashes)


TRAINING_ROOMS = ["errors", "stopping", "step", "checkpoint", "distributed", "monitoring", "loop", "job", "command"]
"""The rooms of ``transformer.training`` (its sub-packages and top modules), lowest first: a room
imports only rooms before it (``transformer/training/__init__.py`` states the same order)."""


def _room(module: str) -> str | None:
    """``transformer.training.step.ema`` -> ``step``; None outside ``transformer.training`` rooms."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["transformer", "training"] else None


def test_the_training_rooms_import_in_their_order():
    graph = _graph()[0]
    rooms = {_room(m) for m in graph if _room(m)}
    assert rooms == set(TRAINING_ROOMS), f"rooms not in the order list: {rooms - set(TRAINING_ROOMS)}"
    order = {room: i for i, room in enumerate(TRAINING_ROOMS)}
    upward = []
    for module, imports in graph.items():
        room = _room(module)
        if room is None:
            continue
        for target in imports:
            other = _room(target)
            if other is not None and other != room and order[other] > order[room]:
                upward.append(f"{module} -> {target}")
    assert upward == [], "a training room imports one after it: " + ", ".join(upward)
    folded: dict[str, set[str]] = {}
    for module, imports in graph.items():
        if _room(module):
            folded.setdefault(_room(module), set()).update(r for r in map(_room, imports) if r and r != _room(module))
    assert _cycle(folded) is None


def test_no_training_room_is_too_big_without_sub_rooms():
    """A room over ~2,500 lines is split into sub-rooms."""
    sizes: dict[str, int] = {}
    for path in (PACKAGE / "training").rglob("*.py"):
        parts = path.relative_to(PACKAGE / "training").parts
        room = parts[0].removesuffix(".py")
        sizes[room] = sizes.get(room, 0) + len(path.read_text(encoding="utf-8").splitlines())
    assert max(sizes.values()) <= 2500, sizes


REMOVED_PATHS = ("transformer.training.run", "transformer.training.trainer", "transformer.evaluation.run")
"""Old module paths that moved and are gone (docs/contributing.md, "Changelog"): nothing imports them."""

NO_RE_EXPORTS = ("transformer.modules.attention", "transformer.modules.moe")
"""Modules that export only what they define: their building blocks' homes are imported directly
(``attention_core``: the cache, masks and per-stack inputs; ``mla``; ``moe_router``: the router)."""


def _project_imports() -> list[tuple[str, str, str | None]]:
    """``(file:line, module, name)`` for every import in the project's Python files and notebooks:
    ``import a.b`` gives ``("a.b", None)``, ``from a import b`` gives ``("a", "b")``."""
    from tests.test_dependencies import _sources  # the one reader of notebooks' code cells

    found = []
    sources = _sources() + [(p, p.read_text(encoding="utf-8")) for p in sorted((REPO_ROOT / "examples").rglob("*.py"))]
    for path, source in sources:
        where = path.relative_to(REPO_ROOT)
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                found += [(f"{where}:{node.lineno}", a.name, None) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found += [(f"{where}:{node.lineno}", node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args:
                if isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                    found.append((f"{where}:{node.lineno}", node.args[0].value, None))
    return found


def _defined(module: str) -> set[str]:
    """The names a module's own top-level statements define (classes, functions, assignments other
    than an alias of an imported name)."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text(encoding="utf-8"))
    imported = {(a.asname or a.name) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in imported:
            continue  # ``_alias = imported_name`` re-exports under another name
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_the_removed_module_paths_are_gone_and_nothing_imports_them():
    for old in REMOVED_PATHS:
        assert importlib.util.find_spec(old) is None, f"{old} exists: import its home (docs/contributing.md)"
    through = [
        f"{where}: {module}" + (f".{name}" if name else "")
        for where, module, name in _project_imports()
        if module in REMOVED_PATHS or (name and f"{module}.{name}" in REMOVED_PATHS)
    ]
    assert through == [], "imports of removed module paths: " + ", ".join(through)


def test_names_are_imported_from_their_home_not_through_a_module_that_imported_them():
    defined = {module: _defined(module) for module in NO_RE_EXPORTS}
    through = [
        f"{where}: from {module} import {name}"
        for where, module, name in _project_imports()
        if module in defined and name and name not in defined[module]
    ]
    assert through == [], "import these from their home module: " + ", ".join(through)
    for module in NO_RE_EXPORTS:
        exported = set(importlib.import_module(module).__all__)
        assert exported <= defined[module], f"{module}.__all__ re-exports {sorted(exported - defined[module])}"


def test_scripts_and_benchmarks_run_on_the_installed_package_without_editing_sys_path():
    """``python scripts/NAME.py`` and ``python -m benchmarks.NAME`` import the installed package; none of
    them puts a folder on ``sys.path`` (a second way to find the code, and another copy's code found
    first), and a benchmark imports another as ``benchmarks.NAME``."""
    edits = []
    siblings = {path.stem for path in (REPO_ROOT / "benchmarks").glob("*.py")} | {"gpu_check"}
    for path in sorted([*(REPO_ROOT / "scripts").glob("*.py"), *(REPO_ROOT / "benchmarks").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import | ast.ImportFrom) and not getattr(node, "level", 0):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                # a benchmark found as a top-level module only when its folder is on sys.path
                edits += [f"{path.relative_to(REPO_ROOT)}:{node.lineno} imports {n}" for n in names if n in siblings]
            target = node.func.value if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else None
            if isinstance(node, (ast.Assign, ast.AugAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                target = target.value if isinstance(target, ast.Subscript) else target
            if isinstance(target, ast.Attribute) and ast.unparse(target) == "sys.path":
                edits.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not edits, edits
