"""Value ranges of the config's numeric fields and the allowed values of its choice-valued
ones, declared beside each field and checked by one walk over the dataclasses.

A field with a range is written ``lr: float = ranged(1e-4, "(0, inf)")``: the interval (in
the notation of `reroll.registry.Range`, the same one component hyperparameters declare)
sits in the field's metadata, next to the field's docstring. A field with a fixed set of
values is written ``kind: str = ranged("local", choices=("local", "ray"))``. `check_ranges`
walks a loaded config, nested tables included, and refuses the first value outside its
interval or its choices with an error naming the key (as on the command line) and what is
allowed. Choices that are registry entries are not declared here: `validate` checks them
against their registry. Knows no registry and no particular setting.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from reroll.errors import ConfigError
from reroll.registry import check_range, parse_range


def ranged(default: Any, interval: str | None = None, *,
           choices: tuple[str, ...] | None = None) -> Any:
    """A dataclass field with ``default`` whose value must lie in ``interval`` (e.g.
    ``"[1, inf)"``; parsed now, so a malformed interval fails at import), or be one of
    ``choices`` (the default among them)."""
    if (interval is None) == (choices is None):
        raise ValueError("ranged: give an interval or choices, not both or neither")
    if choices is not None:
        if default not in choices:
            raise ValueError(f"ranged: default {default!r} is not one of {choices}")
        return dataclasses.field(default=default, metadata={"choices": tuple(choices)})
    parse_range(interval)
    return dataclasses.field(default=default, metadata={"range": interval})


def field_ranges(cls: type, prefix: str = "") -> dict[str, str]:
    """Dotted key -> declared interval (choices as ``"{a, b}"``, the notation of
    `reroll.registry.Choice`), for every ranged field of ``cls`` and its tables."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if "range" in f.metadata:
            out[prefix + f.name] = f.metadata["range"]
        elif "choices" in f.metadata:
            out[prefix + f.name] = "{" + ", ".join(f.metadata["choices"]) + "}"
        elif f.default_factory is not dataclasses.MISSING:
            inner = f.default_factory
            if isinstance(inner, type) and dataclasses.is_dataclass(inner):
                out |= field_ranges(inner, prefix + f.name + ".")
    return out


def check_ranges(cfg: Any, prefix: str = "") -> None:
    """Raise `ConfigError` for the first field of ``cfg`` (walked in declaration order,
    nested tables included) whose value lies outside its declared interval or choices."""
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if "range" in f.metadata:
            err = check_range(prefix + f.name, value, f.metadata["range"])
            if err:
                raise ConfigError(err)
        elif "choices" in f.metadata:
            if value not in f.metadata["choices"]:
                raise ConfigError(f"{prefix + f.name} must be one of "
                                  f"{', '.join(f.metadata['choices'])}, got {value!r}")
        elif dataclasses.is_dataclass(value):
            check_ranges(value, prefix + f.name + ".")
