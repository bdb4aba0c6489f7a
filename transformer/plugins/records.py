"""What a run records of its plugins, and importing them again for a later command on the run, as
the package docstring (:mod:`transformer.plugins`) says: from where they were, from a folder the
user names, or, with ``plugins_trust=true`` on the command line, from the run folder's copy."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformer.plugins.core import (
    _LOADED,
    _USER,
    Plugin,
    PluginError,
    _locate,
    _name_of,
    _sha256,
    import_plugin,
    plugin_files,
)
from transformer.runs.io import atomic_write_bytes

__all__ = ["RUN_SUBDIR", "import_recorded", "kept_recorded_paths", "record_plugins", "untrusted"]

RUN_SUBDIR = "plugins"
"""The run folder's copy of the plugins it trained with: ``<run>/plugins/<plugin name>/``."""


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


def kept_recorded_paths(
    plugins: Iterable[Plugin], paths: list[str], recorded: Iterable[str] | None, run_dir: str | Path
) -> list[str]:
    """``paths`` (:func:`record_plugins`'s) with each plugin imported from inside ``run_dir`` (its
    trusted copy) recorded by the path the run recorded before: a resume with ``plugins_trust=true``
    never turns a run's record of where its plugins live into its own copy."""
    before = {_name_of(str(e)): str(e) for e in recorded or []}
    return [before.get(p.name, path) if _inside(p.root, Path(run_dir)) else path for p, path in zip(plugins, paths)]


def _expected(recorded: dict[str, str], name: str) -> dict[str, str]:
    prefix = name + "/"
    return {k[len(prefix) :]: v for k, v in recorded.items() if k.startswith(prefix)}


def _differing(root: Path, expected: dict[str, str]) -> str:
    """``<files> differ(s) in <root>``: the files of the plugin folder ``root`` whose sha256 is not the
    recorded one (or that were added or removed since)."""
    now = plugin_files(root)
    changed = sorted(k for k in expected.keys() | now.keys() if expected.get(k) != now.get(k))
    verb = "differs" if len(changed) == 1 else "differ"
    return f"{', '.join(changed[:4])}{' and more' if len(changed) > 4 else ''} {verb} in {root}"


def _what_became_of(entry: str, expected: dict[str, str]) -> str:
    """``is not there any more`` or ``has changed since the run (<files> differ in <folder>)`` for a
    recorded plugin."""
    try:
        _, root, _ = _locate(entry)
    except PluginError:
        return "is not there any more"
    return f"has changed since the run ({_differing(root, expected)})"


def _named_folders(entry: str, name: str, expected: dict[str, str]) -> str:
    """``; the folder you named, <folder>, holds other files (<files> differ in <folder>)`` for each
    folder of the plugin's name on the command line (``plugins=[...]``) other than the recorded one:
    where the command looked, and which of its files are not the run's; empty when there is none."""
    try:
        recorded = _locate(entry)[1]
    except PluginError:
        recorded = None
    said = []
    for path in _USER["paths"]:
        if _name_of(str(path)) != name:
            continue
        try:
            _, root, on_disk = _locate(str(path))
        except PluginError:
            continue
        if on_disk and root != recorded:
            said.append(f"; the folder you named, {root}, holds other files ({_differing(root, expected)})")
    return "".join(said)


def _refuse_a_renamed_copy(run_dir: str | Path, name: str, expected: dict[str, str]) -> None:
    """A folder the user named holds the recorded files under another name: say that the folder's name
    is the plugin's (its import name, the key of its recorded files) instead of refusing it as unknown."""
    for path in _USER["paths"]:
        try:
            _, root, on_disk = _locate(path)
        except PluginError:
            continue
        if (
            on_disk
            and (root.stem if root.is_file() else root.name) != name
            and expected
            and plugin_files(root) == expected
        ):
            raise PluginError(
                f"plugins: {root} holds the files of the plugin {name} that {run_dir} recorded, under "
                f"another name; a plugin is imported under its folder's name: name the folder {name}"
            )


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
                raise PluginError(
                    f"{run_dir} records the plugin {entry} without the hashes of its files "
                    f"(plugin_files): it is imported only from a folder you name, "
                    f"plugins=[<folder named {name}>]"
                )
            _refuse_a_renamed_copy(run_dir, name, expected)
            copy = Path(run_dir) / RUN_SUBDIR / name
            if not (copy / "__init__.py").is_file() and (copy / f"{name}.py").is_file():
                copy = copy / f"{name}.py"  # a single-file plugin
            if not copy.exists():
                raise PluginError(
                    f"{run_dir} was trained with the plugin {entry}, which {_what_became_of(entry, expected)}"
                    f"{_named_folders(entry, name, expected)}, and the run folder holds no copy ({copy}); "
                    f"pass plugins=[<folder named {name}>] "
                    "with the plugin's files as they were"
                )
            if not _USER["trust"]:
                became = (
                    "lies in the run folder itself (a run folder's own files are never imported on its say)"
                    if own_copy
                    else _what_became_of(entry, expected)
                )
                raise PluginError(
                    f"{run_dir} was trained with the plugin {entry}, which {became}{_named_folders(entry, name, expected)}; "
                    f"the run recorded its files in {copy} ({', '.join(sorted(expected)) or 'none'}): "
                    f"add plugins_trust=true to import that copy, or plugins=[<folder named {name}>] with "
                    "the original files"
                )
            if plugin_files(copy) != expected:
                raise PluginError(
                    f"{copy} does not hold the files {run_dir} recorded (their sha256 differ): the copy "
                    "was changed; restore it or pass plugins=[<folder>] with the original files"
                )
            found = str(copy)
        imported.append(import_plugin(found))
    return imported
