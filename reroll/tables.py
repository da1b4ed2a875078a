"""Plain TOML tables <-> typed dataclasses: build a dataclass tree from a dict (unknown keys
named with the closest valid one, values converted to the field's type or rejected),
``a.b=c`` overrides, merging, reading and cleaning tables. Generic: knows no reroll setting
(`reroll.config` declares them)."""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from reroll.errors import ConfigError
from reroll.registry import closest


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _convert(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return build(tp, value, prefix=key + ".")
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        raise ConfigError(f"{key}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except ValueError:
            raise ConfigError(f"{key}: expected an integer, got {value!r}") from None
        if f != int(f):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return int(f)
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return str(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a table, got {value!r}")
        return dict(value)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return list(value)
    return value


def build(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    hints = _hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in hints:
            raise ConfigError(f"unknown config key {prefix + key!r}"
                              f"{closest(prefix + key, [prefix + n for n in names])}")
        kwargs[key] = _convert(value, hints[key], prefix + key)
    return cls(**kwargs)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


# ---- overrides ---------------------------------------------------------------------------


def parse_value(text: str) -> Any:
    """A command-line value: TOML literal if it parses as one, else the plain string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict[str, Any], item: str) -> None:
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like key.path=value")
    key, text = item.split("=", 1)
    parts = key.strip().split(".")
    node = data
    for i, p in enumerate(parts[:-1]):
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[:i + 1])!r} holds "
                              f"{node!r} (set by the config file or an earlier override), "
                              f"not a table of keys")
    value = parse_value(text.strip())
    if isinstance(node.get(parts[-1]), dict) and not isinstance(value, dict):
        raise ConfigError(f"override {item!r}: {key.strip()!r} is a section of the config, not "
                          f"a value; set its keys ({key.strip()}.KEY=VALUE) or a whole table "
                          f"({key.strip()}={{KEY = VALUE}})")
    node[parts[-1]] = value


def merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for k, v in top.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_toml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    if p.is_dir():
        raise ConfigError(f"config file {str(p)!r} is a directory, not a TOML file")
    if not p.is_file():
        raise ConfigError(f"config file {str(p)!r} does not exist")
    try:
        return tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: invalid TOML: {e}") from None


def drop_none(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: drop_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [drop_none(v) for v in d]
    return d
