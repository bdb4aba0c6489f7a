"""The plugins themselves: where a ``plugins`` entry is, importing it once per process, what the
command's user named (:func:`set_user_choice`), and the options each plugin registered
(:data:`ORIGINS`). The package docstring (:mod:`transformer.plugins`) tells the whole story."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser

__all__ = [
    "ORIGINS",
    "Plugin",
    "PluginError",
    "command_line_plugins",
    "current_plugin",
    "hydra_searchpath",
    "import_plugin",
    "import_plugins",
    "loaded_plugins",
    "plugin_failure",
    "plugin_files",
    "plugin_of",
    "plugins_named",
    "set_user_choice",
]


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


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def plugin_files(root: Path) -> dict[str, str]:
    """``relative path -> sha256`` of a plugin's ``.py`` files and its ``configs/**.yaml`` files
    (``__pycache__`` and hidden files left out); a single-file plugin has one entry, its file name."""
    root = Path(root)
    if root.is_file():
        return {root.name: _sha256(root)}
    found = sorted(
        p
        for p in root.rglob("*")
        if p.is_file()
        and (p.suffix == ".py" or (p.suffix in (".yaml", ".yml") and p.relative_to(root).parts[0] == "configs"))
        and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts)
    )
    return {p.relative_to(root).as_posix(): _sha256(p) for p in found}


def _locate(entry: str) -> tuple[str, Path, bool]:
    """``(name, root, on_disk)`` of a ``plugins`` entry: a folder (a package), a ``.py`` file, or an
    importable module name (root = its package folder or file)."""
    path = Path(entry).expanduser()
    if path.exists():
        path = path.resolve()
        if path.is_dir() and not (path / "__init__.py").is_file():
            raise PluginError(
                f"plugins: {path} is a folder without __init__.py; a plugin folder is a Python "
                "package whose __init__.py imports its modules (they register their options)"
            )
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
            raise PluginError(
                f"plugins: the name {name} of {root} is already an imported module "
                f"({getattr(held, '__file__', None) or 'built in'}); rename the plugin folder"
            )
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


def _name_of(entry: str) -> str:
    path = Path(entry)
    return path.stem if path.suffix == ".py" else (path.name if "/" in entry else entry.rsplit(".", 1)[-1])


def plugin_failure(err: BaseException) -> PluginError | None:
    """A :class:`~transformer.plugins.PluginError` ``the plugin <name> failed at <file>:<line>: ...``
    from the innermost traceback frame of ``err`` (or its causes) inside a loaded plugin's folder, or
    None when no plugin's code is in the traceback."""
    roots = [(p.name, p.root.resolve()) for p in loaded_plugins()]
    if not roots:
        return None
    seen: set[int] = set()
    chain: BaseException | None = err
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        where = None
        tb = chain.__traceback__
        while tb is not None:
            file = Path(tb.tb_frame.f_code.co_filename).resolve()
            owner = next((name for name, root in roots if file == root or root in file.parents), None)
            if owner is not None:
                where = (owner, file, tb.tb_lineno)
            tb = tb.tb_next
        if where is not None:
            owner, file, line = where
            return PluginError(
                f"the plugin {owner} failed at {file}:{line}: " + " ".join(f"{type(chain).__name__}: {chain}".split())
            )
        chain = chain.__cause__ or chain.__context__
    return None
