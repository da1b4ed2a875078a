"""A run's own plug-in modules: ``plugins = ["my_module", ...]`` (a top-level config key)
names modules of the user's that register environments, verifiers, tasks, workflows or
engines into reroll's registries. They are imported before the config is checked (first
thing in `reroll.config_checks.validate`), so a name they register is valid in the same
config, from the CLI as from Python.

A module is looked up like ``python -m`` does it: the current directory first, then
``sys.path``. The names (and that directory) are passed on to the processes a run starts
through the environment (``REROLL_PLUGINS``, ``PYTHONPATH``): the scoring workers and Ray's
actors import them too (`import_inherited`, called where such a process builds its
components).

An installed package can declare its modules in the entry-point group ``reroll.plugins``
(``[project.entry-points."reroll.plugins"] name = "module"`` in its pyproject.toml): they
are imported at the same places (`import_entry_points`), in every run, without a
``plugins`` entry. Knows nothing of the registries or of torch.
"""

from __future__ import annotations

import importlib
import os
import sys

ENV = "REROLL_PLUGINS"
"""The environment variable that hands the plug-in modules to child processes."""
GROUP = "reroll.plugins"
"""The entry-point group of installed packages' plug-in modules."""
_entry_points_loaded = False


def import_entry_points() -> None:
    """Import (once per process) what every installed distribution declares in the
    entry-point group ``reroll.plugins``. One that fails to import is a `ConfigError` naming
    the entry point, its value and its distribution, with the error it raised."""
    global _entry_points_loaded
    from importlib.metadata import entry_points

    from reroll.errors import ConfigError

    if _entry_points_loaded:
        return
    for ep in entry_points(group=GROUP):
        try:
            ep.load()
        except Exception as e:
            dist = f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "unknown"
            raise ConfigError(f"plugin entry point {ep.name!r} = {ep.value!r} (group {GROUP!r}, "
                              f"distribution {dist}) failed to import: {type(e).__name__}: "
                              f"{e}") from e
    _entry_points_loaded = True


def import_plugins(names: list[str] | tuple[str, ...]) -> None:
    """Import each of ``names`` (once; Python caches modules) and record them in the
    environment for child processes. A module that cannot be imported is a `ConfigError`
    naming it and what failed."""
    from reroll.errors import ConfigError

    import_entry_points()
    if not names:
        return
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"plugins: each entry is a module name, got {name!r}")
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise ConfigError(f"plugins: cannot import {name!r} ({e}); it must be importable "
                              f"from the working directory or PYTHONPATH") from None
    inherited = [n for n in os.environ.get(ENV, "").split(",") if n]
    os.environ[ENV] = ",".join(dict.fromkeys([*inherited, *names]))
    path = os.environ.get("PYTHONPATH", "")
    if cwd not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, path) if p)


def import_inherited() -> None:
    """Import the plug-in modules this process's parent recorded (``REROLL_PLUGINS``) and
    the installed packages' (`import_entry_points`)."""
    names = [n for n in os.environ.get(ENV, "").split(",") if n]
    for p in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if p and p not in sys.path:
            sys.path.insert(0, p)
    for name in names:
        importlib.import_module(name)
    import_entry_points()
