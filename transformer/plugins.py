"""Plugins: the user's own switch options, imported from their folder, recorded with the run, and
never imported behind the user's back.

A plugin is a folder that is a Python package (``my_ideas/__init__.py``, which registers options
through :mod:`transformer.registry`), a single ``.py`` file, or an importable module name. The
switch ``plugins=[path/to/my_ideas]`` imports it before the configuration is validated, and adds its
``configs/`` folder (when it has one) to Hydra's search path. Like fairseq's ``--user-dir``, the
folder's parent goes on ``sys.path`` and the package is imported under its folder name, so its own
modules import each other as usual.

**Recorded with the run.** A training run writes ``plugin_files`` into its config (``<plugin
name>/<file> -> sha256`` for every ``.py`` and ``configs/**.yaml`` file) and copies the files into
``<run>/plugins/<plugin name>/`` (:func:`record_plugins`). Any later command that loads the run
(:func:`import_recorded`: translate, evaluate, export, a resume) imports the plugin again:

1. from the folder it was trained with (``plugins`` holds its absolute path), when every file
   there still has its recorded hash and the folder lies outside the run folder;
2. else from a folder the user names (``plugins=[...]`` on that command), when its files match;
3. else, only with ``plugins_trust=true`` on that command, from the run folder's copy (checked
   against the hashes).

Otherwise the command stops with one line naming the recorded files and ``plugins_trust=true``
(:class:`PluginError`): loading a checkpoint never executes code the user did not choose (the reason
weights are read with safetensors and ``weights_only``; Hugging Face asks for
``trust_remote_code=True``).

**Trust is the command's, never the folder's.** ``plugins_trust`` is read from the command line of
each command only (:func:`set_user_choice`); a run never records it as true (:func:`untrusted`
clears it before a config is written) and a recorded value is ignored. A run folder received from
someone else cannot vouch for itself: a recorded path inside the run folder (its own copy, or any
other folder in it) is never "the folder it was trained with", and a recorded plugin without
recorded hashes is imported only from a folder the user names.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from hydra.core.override_parser.overrides_parser import OverridesParser

from transformer.io import atomic_write_bytes

__all__ = [
    "ORIGINS",
    "Plugin",
    "PluginError",
    "command_line_plugins",
    "current_plugin",
    "hydra_searchpath",
    "import_plugin",
    "import_plugins",
    "import_recorded",
    "kept_recorded_paths",
    "loaded_plugins",
    "plugin_files",
    "plugin_of",
    "plugins_named",
    "record_plugins",
    "set_user_choice",
    "untrusted",
]

RUN_SUBDIR = "plugins"
"""The run folder's copy of the plugins it trained with: ``<run>/plugins/<plugin name>/``."""


class PluginError(ValueError):
    """A plugin that cannot be imported, or a recorded one that is not trusted (one line, naming the
    files and the switch that helps)."""


@dataclass(frozen=True)
class Plugin:
    """One imported plugin.

    Attributes:
        name: its name (the folder's, the file's stem, or the module's last component): the module
            name it is imported under and the prefix of its keys in ``plugin_files``.
        root: the folder (or single file) its files were read from.
        files: ``relative path -> sha256`` of its ``.py`` and ``configs/**.yaml`` files.
        module: the imported module's name.
    """

    name: str
    root: Path
    files: dict[str, str] = field(default_factory=dict)
    module: str = ""

    @property
    def configs(self) -> Path | None:
        """Its ``configs/`` folder (Hydra search path), or None."""
        folder = self.root / "configs" if self.root.is_dir() else None
        return folder if folder is not None and folder.is_dir() else None


_LOADED: dict[str, Plugin] = {}  # plugin name -> the imported plugin
_CURRENT: list[str] = []  # the plugin being imported (registrations are attributed to it)
_USER = {"paths": [], "trust": False}  # what the command's user named: plugins=[...], plugins_trust=
ORIGINS: dict[tuple[str, str], str] = {}
"""``(switch, option) -> plugin name`` of every option a plugin registered (``transformer.registry``
fills it): exporters refuse these by name, error messages name the plugin."""


def current_plugin() -> str | None:
    """The name of the plugin being imported now, or None (a registration outside any plugin)."""
    return _CURRENT[-1] if _CURRENT else None


def plugin_of(switch: str, option: str) -> str | None:
    """The plugin that registered ``switch=option``, or None for a built-in option."""
    return ORIGINS.get((switch, option))


def loaded_plugins() -> list[Plugin]:
    """The plugins imported in this process, in import order."""
    return list(_LOADED.values())


def set_user_choice(paths: Iterable[str] | None = None, trust: bool = False) -> None:
    """What the current command's user named (``plugins=[...]``, ``plugins_trust=``): folders that
    may stand in for a recorded plugin with the same files, and whether run folders' recorded copies
    may be imported. Scripts call it once from their command line."""
    _USER["paths"] = [str(p) for p in (paths or [])]
    _USER["trust"] = bool(trust)


def untrusted(config: Any) -> Any:
    """``config`` (a dict, DictConfig or dataclass-typed config with a ``plugins_trust`` field) with
    ``plugins_trust`` set to false, in place: what a run writes into its folder and what a command
    reads from one, so that trust never travels with a run (it is each command's own switch).

    Returns:
        ``config`` itself.
    """
    if isinstance(config, dict):
        if config.get("plugins_trust"):
            config["plugins_trust"] = False
    elif getattr(config, "plugins_trust", False):
        config.plugins_trust = False
    return config


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` (resolved) is ``folder`` or lies under it."""
    try:
        path.resolve().relative_to(folder.resolve())
    except ValueError:
        return False
    return True


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plugin_files(root: Path) -> dict[str, str]:
    """``relative path -> sha256`` of a plugin's ``.py`` files and its ``configs/**.yaml`` files
    (``__pycache__`` and hidden files left out); a single-file plugin has one entry, its file name."""
    root = Path(root)
    if root.is_file():
        return {root.name: _sha256(root)}
    found = sorted(p for p in root.rglob("*") if p.is_file() and (
        p.suffix == ".py" or (p.suffix in (".yaml", ".yml") and p.relative_to(root).parts[0] == "configs"))
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts))
    return {p.relative_to(root).as_posix(): _sha256(p) for p in found}


def _locate(entry: str) -> tuple[str, Path, bool]:
    """``(name, root, on_disk)`` of a ``plugins`` entry: a folder (a package), a ``.py`` file, or an
    importable module name (root = its package folder or file)."""
    path = Path(entry).expanduser()
    if path.exists():
        path = path.resolve()
        if path.is_dir() and not (path / "__init__.py").is_file():
            raise PluginError(f"plugins: {path} is a folder without __init__.py; a plugin folder is a Python "
                              "package whose __init__.py imports its modules (they register their options)")
        if path.is_file() and path.suffix != ".py":
            raise PluginError(f"plugins: {path} is neither a folder nor a .py file")
        return (path.stem if path.is_file() else path.name), path, True
    if "/" in entry or entry.endswith(".py"):
        raise PluginError(f"plugins: {entry} does not exist")
    try:
        spec = importlib.util.find_spec(entry)
    except (ImportError, ValueError) as err:
        raise PluginError(f"plugins: {entry} is neither a folder nor an importable module ({err})") from None
    if spec is None or spec.origin is None:
        raise PluginError(f"plugins: {entry} is neither a folder nor an importable module")
    origin = Path(spec.origin)
    return entry.rsplit(".", 1)[-1], origin.parent if origin.name == "__init__.py" else origin, False


@contextlib.contextmanager
def _importing(name: str) -> Iterator[None]:
    _CURRENT.append(name)
    try:
        yield
    finally:
        _CURRENT.pop()


def _import_error(entry: str, err: BaseException) -> PluginError:
    """One line naming the plugin's file and line where the import failed, and the error."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "importlib" not in f.filename]
    root = str(_locate(entry)[1])
    own = [f for f in frames if f.filename.startswith(root)]  # the plugin's own line, not the zoo's below it
    frame = (own or frames or [None])[-1]
    where = f"{frame.filename}:{frame.lineno}: " if frame else ""
    message = str(err).splitlines()[0] if str(err) else ""
    if isinstance(err, SyntaxError) and err.filename:  # raised by the compiler: where is the error itself
        where, message = f"{err.filename}:{err.lineno}: ", err.msg
    return PluginError(f"plugin {entry} failed to import: {where}{type(err).__name__}: {message}")


def import_plugin(entry: str | Path) -> Plugin:
    """Import one plugin (a folder, a ``.py`` file or a module name) once per process.

    Raises:
        PluginError: it does not exist, another plugin of the same name was imported from elsewhere,
            its module name is taken by another module, or importing it raised (the file, line and
            error named).
    """
    entry = str(entry)
    name, root, on_disk = _locate(entry)
    loaded = _LOADED.get(name)
    if loaded is not None:
        if loaded.root != root and loaded.files != plugin_files(root):
            raise PluginError(f"plugins: two plugins named {name}: {loaded.root} and {root} (rename one folder)")
        return loaded
    module = name if on_disk else entry
    if on_disk:
        held = sys.modules.get(name)
        if held is not None and not str(getattr(held, "__file__", "") or "").startswith(str(root)):
            raise PluginError(f"plugins: the name {name} of {root} is already an imported module "
                              f"({getattr(held, '__file__', None) or 'built in'}); rename the plugin folder")
        parent = str(root.parent)
        if parent not in sys.path:
            sys.path.insert(0, parent)
    files = plugin_files(root)
    with _importing(name):
        try:
            importlib.import_module(module)
        except PluginError:
            raise
        except Exception as err:  # the user's code: one line naming where it failed
            sys.modules.pop(module, None)
            raise _import_error(entry, err) from None
    plugin = Plugin(name=name, root=root, files=files, module=module)
    _LOADED[name] = plugin
    return plugin


def import_plugins(entries: Iterable[str | Path] | None) -> list[Plugin]:
    """Import every ``plugins`` entry in order (:func:`import_plugin`)."""
    return [import_plugin(e) for e in entries or []]


def plugins_named(entries: Iterable[str | Path] | None) -> list[Plugin]:
    """The plugins of a config's ``plugins`` entries: the one already imported under each entry's name
    (e.g. from a run folder's trusted copy), else the entry imported now (:func:`import_plugin`)."""
    return [_LOADED.get(_name_of(str(e))) or import_plugin(e) for e in entries or []]


def hydra_searchpath(plugins: Iterable[Plugin]) -> list[str]:
    """``file://`` entries of Hydra's search path for the plugins' ``configs/`` folders."""
    return [f"file://{p.configs}" for p in plugins if p.configs is not None]


def command_line_plugins(argv: list[str]) -> list[str]:
    """A Hydra command line with its ``plugins=[...]`` imported first: the user's choice is set
    (:func:`set_user_choice`) and the plugins' ``configs/`` folders are appended to
    ``hydra.searchpath``, so that ``model/attention=<plugin option>`` and ``+ladder=<plugin step>``
    compose. Scripts call it before Hydra parses the command line.

    Returns:
        ``argv`` with the search path override added (unchanged without plugins).

    Raises:
        PluginError: a plugin that cannot be imported (one line naming its file and the error).
    """
    entries: list[str] = []
    trust, searchpath, rest = False, [], []
    for arg in argv:
        key = arg.lstrip("+~").split("=", 1)[0]
        if key in ("plugins", "plugins_trust", "hydra.searchpath") and "=" in arg:
            value = OverridesParser.create().parse_override(arg).value()
            if key == "plugins":
                entries = [str(v) for v in (value if isinstance(value, list) else [value] if value else [])]
            elif key == "plugins_trust":
                trust = str(value).lower() == "true"
            else:
                searchpath = [str(v) for v in (value if isinstance(value, list) else [value])]
                continue
        rest.append(arg)
    set_user_choice(entries, trust)
    searchpath += hydra_searchpath(import_plugins(entries))
    if not searchpath:
        return rest
    at = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))  # among the overrides
    return rest[:at] + [f"hydra.searchpath=[{','.join(searchpath)}]"] + rest[at:]


def record_plugins(plugins: Iterable[Plugin], run_dir: str | Path | None = None) -> tuple[list[str], dict[str, str]]:
    """What a run records of its plugins, and the copy of their files in ``<run_dir>/plugins/``.

    Returns:
        ``(plugins, plugin_files)`` for the run's config: each plugin's absolute folder (or file, or
        module name) and ``<plugin name>/<relative path> -> sha256`` of its files.
    """
    plugins = list(plugins)
    paths = [str(p.root) if p.module == p.name else p.module for p in plugins]
    hashes = {f"{p.name}/{rel}": sha for p in plugins for rel, sha in p.files.items()}
    if run_dir is not None:
        for p in plugins:
            for rel, sha in p.files.items():
                dest = Path(run_dir) / RUN_SUBDIR / p.name / rel
                if dest.is_file() and _sha256(dest) == sha:
                    continue
                source = p.root / rel if p.root.is_dir() else p.root
                atomic_write_bytes(dest, source.read_bytes())
    return paths, hashes


def kept_recorded_paths(plugins: Iterable[Plugin], paths: list[str], recorded: Iterable[str] | None,
                        run_dir: str | Path) -> list[str]:
    """``paths`` (:func:`record_plugins`'s) with each plugin imported from inside ``run_dir`` (its
    trusted copy) recorded by the path the run recorded before: a resume with ``plugins_trust=true``
    never turns a run's record of where its plugins live into its own copy."""
    before = {_name_of(str(e)): str(e) for e in recorded or []}
    return [before.get(p.name, path) if _inside(p.root, Path(run_dir)) else path for p, path in zip(plugins, paths)]


def _expected(recorded: dict[str, str], name: str) -> dict[str, str]:
    prefix = name + "/"
    return {k[len(prefix):]: v for k, v in recorded.items() if k.startswith(prefix)}


def _name_of(entry: str) -> str:
    path = Path(entry)
    return path.stem if path.suffix == ".py" else (path.name if "/" in entry else entry.rsplit(".", 1)[-1])


def _what_became_of(entry: str, expected: dict[str, str]) -> str:
    """``is not there any more`` or ``has changed since the run (<files>)`` for a recorded plugin."""
    try:
        _, root, _ = _locate(entry)
    except PluginError:
        return "is not there any more"
    now = plugin_files(root)
    changed = sorted(k for k in expected.keys() | now.keys() if expected.get(k) != now.get(k))
    return f"has changed since the run ({', '.join(changed[:4])}{' and more' if len(changed) > 4 else ''})"


def _refuse_a_renamed_copy(run_dir: str | Path, name: str, expected: dict[str, str]) -> None:
    """A folder the user named holds the recorded files under another name: say that the folder's name
    is the plugin's (its import name, the key of its recorded files) instead of refusing it as unknown."""
    for path in _USER["paths"]:
        try:
            _, root, on_disk = _locate(path)
        except PluginError:
            continue
        if on_disk and (root.stem if root.is_file() else root.name) != name and expected and plugin_files(root) == expected:
            raise PluginError(f"plugins: {root} holds the files of the plugin {name} that {run_dir} recorded, under "
                              f"another name; a plugin is imported under its folder's name: name the folder {name}")


def import_recorded(run_dir: str | Path, config: Any) -> list[Plugin]:
    """Import the plugins a run folder's config records (``plugins``, ``plugin_files``), as the module
    docstring says: from where they were, from a folder the user named, or (``plugins_trust``) from
    the run's copy, each only when its files have the recorded hashes.

    Args:
        run_dir: the run folder (its ``plugins/`` holds the copy).
        config: the run's config (a dict or DictConfig with ``plugins`` and ``plugin_files``).

    Raises:
        PluginError: a recorded plugin found nowhere with its files (one line naming the run's files
            and ``plugins_trust=true``), or a copy whose files were changed.
    """
    get = config.get if hasattr(config, "get") else (lambda k, d=None: getattr(config, k, d))
    entries = [str(e) for e in (get("plugins", None) or [])]
    recorded = dict(get("plugin_files", None) or {})
    imported = []
    for entry in entries:
        name = _name_of(entry)
        expected = _expected(recorded, name)
        if name in _LOADED and (_LOADED[name].files == expected or not expected):
            imported.append(_LOADED[name])
            continue
        # the recorded folder counts only outside the run folder and with recorded hashes: a run folder
        # never vouches for code it carries itself; the folders the user named are the user's choice
        candidates = [(entry, False)] + [(p, True) for p in _USER["paths"] if _name_of(p) == name]
        found, own_copy = None, False
        for candidate, named in candidates:
            try:
                _, root, on_disk = _locate(candidate)
            except PluginError:
                continue
            if not named and on_disk and _inside(root, Path(run_dir)):
                own_copy = True
                continue
            if plugin_files(root) == expected or (named and not expected):
                found = candidate
                break
        if found is None:
            if not expected:
                raise PluginError(f"{run_dir} records the plugin {entry} without the hashes of its files "
                                  f"(plugin_files): it is imported only from a folder you name, "
                                  f"plugins=[<folder named {name}>]")
            _refuse_a_renamed_copy(run_dir, name, expected)
            copy = Path(run_dir) / RUN_SUBDIR / name
            if not (copy / "__init__.py").is_file() and (copy / f"{name}.py").is_file():
                copy = copy / f"{name}.py"  # a single-file plugin
            if not copy.exists():
                raise PluginError(f"{run_dir} was trained with the plugin {entry}, which {_what_became_of(entry, expected)}, "
                                  f"and the run folder holds no copy ({copy}); pass plugins=[<folder named {name}>] "
                                  "with the plugin's files as they were")
            if not _USER["trust"]:
                became = ("lies in the run folder itself (a run folder's own files are never imported on its say)"
                          if own_copy else _what_became_of(entry, expected))
                raise PluginError(f"{run_dir} was trained with the plugin {entry}, which {became}; "
                                  f"the run recorded its files in {copy} ({', '.join(sorted(expected)) or 'none'}): "
                                  f"add plugins_trust=true to import that copy, or plugins=[<folder named {name}>] with "
                                  "the original files")
            if plugin_files(copy) != expected:
                raise PluginError(f"{copy} does not hold the files {run_dir} recorded (their sha256 differ): the copy "
                                  "was changed; restore it or pass plugins=[<folder>] with the original files")
            found = str(copy)
        imported.append(import_plugin(found))
    return imported

