"""Plugins: the user's own switch options, imported from their folder, recorded with the run, and
never imported behind the user's back (docs/plugins.md#recorded-with-the-run-never-imported-behind-your-back).

A plugin is a package folder, a ``.py`` file or a module name; ``plugins=[...]`` imports it before
validation (its parent on ``sys.path``, like fairseq's ``--user-dir``) and adds its ``configs/``.
A run records its files' hashes and a copy (:func:`record_plugins`); a later command re-imports it
from the trained folder, a folder the user names, or, with ``plugins_trust=true`` on that command
only, the run's copy (:func:`import_recorded`), else raises :class:`PluginError`."""

from transformer.plugins.core import (
    ORIGINS,
    Plugin,
    PluginError,
    command_line_plugins,
    current_plugin,
    hydra_searchpath,
    import_plugin,
    import_plugins,
    loaded_plugins,
    plugin_failure,
    plugin_files,
    plugin_of,
    plugins_named,
    set_user_choice,
)
from transformer.plugins.records import RUN_SUBDIR, import_recorded, kept_recorded_paths, record_plugins, untrusted

__all__ = [
    "ORIGINS",
    "Plugin",
    "PluginError",
    "RUN_SUBDIR",
    "command_line_plugins",
    "current_plugin",
    "hydra_searchpath",
    "import_plugin",
    "import_plugins",
    "import_recorded",
    "kept_recorded_paths",
    "loaded_plugins",
    "plugin_failure",
    "plugin_files",
    "plugin_of",
    "plugins_named",
    "record_plugins",
    "set_user_choice",
    "untrusted",
]
