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
    "plugin_files",
    "plugin_of",
    "plugins_named",
    "record_plugins",
    "set_user_choice",
    "untrusted",
]
