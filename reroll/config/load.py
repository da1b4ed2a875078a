"""Reading a run's config: a TOML file (or the defaults), ``a.b=c`` overrides and a preset,
built into a `RunConfig` (a key the config sets over the preset's value is warned about)
whose keys and types are checked (unknown keys are errors naming
the closest valid one; values are converted to the field's type or rejected); and writing
one back. Checks nothing that needs the registries or looks across fields: the composition
root runs `reroll.config_checks.validate` (or calls `reroll.config_checks.load_checked`).
"""

from __future__ import annotations

from pathlib import Path

from reroll.config.run import RunConfig
from reroll.errors import ConfigError
from reroll.tables import apply_override, build, drop_none, merge, read_toml, to_dict

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def preset_path(name: str) -> Path:
    for root in (REPO_ROOT / "configs" / "presets", Path.cwd() / "configs" / "presets"):
        if (root / f"{name}.toml").is_file():
            return root / f"{name}.toml"
    p = Path(name)
    if p.is_file():
        return p
    raise ConfigError(f"preset {name!r} not found in configs/presets")


def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """The config at ``path`` ("-" or None: the defaults) with ``overrides`` applied and its
    preset merged under it (the file's own keys win). Types are checked; ranges, registry
    choices and combinations are not (`reroll.config_checks.validate`)."""
    data = read_toml(path) if path and str(path) != "-" else {}  # "-": defaults only
    for item in overrides:
        apply_override(data, item)
    if data.get("preset"):
        preset = read_toml(preset_path(str(data["preset"])))
        _warn_overridden(str(data["preset"]), preset, data)
        data = merge(preset, data)
    return build(RunConfig, data)


def _warn_overridden(name: str, preset: dict, data: dict, prefix: str = "") -> None:
    """A warning for each key the preset sets that the config (or an override) sets to
    another value: the config's wins, said once, not silently."""
    import warnings

    for k, v in preset.items():
        if k not in data:
            continue
        if isinstance(v, dict) and isinstance(data[k], dict):
            _warn_overridden(name, v, data[k], f"{prefix}{k}.")
        elif data[k] != v:
            warnings.warn(f"preset {name!r} sets {prefix}{k} = {v!r}; the config's "
                          f"{data[k]!r} is used", UserWarning, stacklevel=3)


def dump_toml(cfg: RunConfig) -> str:
    import tomli_w

    return tomli_w.dumps(drop_none(to_dict(cfg)))
