"""The commands that explain reroll rather than run it: `reroll --version`, `reroll list
[KIND]` (registered components, presets) and `reroll config [--defaults] [CONFIG] [KEY]`.
Text only; the registries are imported when a listing needs them.
"""

from __future__ import annotations

import argparse

from reroll.catalog import (
    BY_KIND,
    CATALOG,
    format_hyperparameter,
    hyperparameters,
    preset_files,
    preset_summary,
    summary,
    wrapped,
)

KINDS = [c.kind for c in CATALOG] + ["presets"]


def version() -> str:
    """The installed distribution's version (its package metadata)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("reroll")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown (reroll is not installed; pip install -e .)"


def list_kind(kind: str) -> str:
    """One registry (or the presets): each name with its summary and hyperparameters."""
    if kind == "presets":
        files = preset_files()
        return "presets (preset=NAME)\n" + "\n".join(
            wrapped(f"{name}: {preset_summary(p)}", 2) for name, p in files.items())
    entry = BY_KIND[kind]
    reg = entry.registry()
    where = f" ({entry.key}{'[].name' if entry.many else ''})" if entry.key else ""
    lines = [f"{kind}{where}"]
    for name in reg.names():
        lines.append(wrapped(f"{name}: {summary(reg.get(name))}".rstrip(": "), 2))
        if entry.args_key or entry.many:
            lines += [wrapped(format_hyperparameter(h), 6) for h in hyperparameters(reg, name)]
    return "\n".join(lines)


def cmd_list(args: argparse.Namespace) -> int:
    kinds = [args.kind] if args.kind else KINDS
    print("\n\n".join(list_kind(k) for k in kinds))
    return 0


def split_config_args(items: list[str]) -> tuple[str | None, list[str], str]:
    """``[CONFIG] [a.b=c ...] [KEY]`` -> (config file or None, overrides, key). The config
    is the first item that is "-" or names a .toml/.yaml file; ``=`` marks an override; a
    remaining item is the key (at most one)."""
    from reroll.errors import ConfigError

    config, overrides, keys = None, [], []
    for i, x in enumerate(items):
        if i == 0 and (x == "-" or x.endswith((".toml", ".yaml", ".yml"))):
            config = x
        elif "=" in x:
            overrides.append(x)
        else:
            keys.append(x)
    if len(keys) > 1:
        raise ConfigError(f"reroll config takes one KEY, got {', '.join(map(repr, keys))} "
                          f"(overrides look like a.b=value)")
    return config, overrides, keys[0] if keys else ""


def cmd_config(args: argparse.Namespace) -> int:
    from reroll.config import RunConfig
    from reroll.config_checks import load_checked
    from reroll.config_docs import describe

    config, overrides, key = split_config_args(args.items)
    if args.defaults:
        cfg = RunConfig()
    else:
        cfg = load_checked(config, overrides)
    print(describe(cfg, only=key))
    return 0


def add_parsers(sub) -> None:
    """`reroll list` and `reroll config` on the CLI's subparsers."""
    p = sub.add_parser("list", help="registered components (advantages, surrogates, ...) and "
                       "presets, with their hyperparameters")
    p.add_argument("kind", nargs="?", choices=KINDS, metavar="KIND",
                   help=f"one of: {', '.join(KINDS)} (default: all)")
    p.set_defaults(fn=cmd_list)
    p = sub.add_parser("config", help="every config key: type, default or resolved value, "
                       "docstring, and the chosen components' hyperparameters")
    p.add_argument("items", nargs="*", metavar="[CONFIG] [a.b=value ...] [KEY]",
                   help="config file ('-' or none: the defaults), overrides, and a key or "
                        "table to show (e.g. train, algo.surrogate_args)")
    p.add_argument("--defaults", action="store_true",
                   help="show the defaults, ignoring CONFIG and overrides")
    p.set_defaults(fn=cmd_config)
