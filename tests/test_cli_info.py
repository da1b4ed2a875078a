"""The CLI explains itself: `reroll --version`, `reroll config` (every key with type, default,
resolved value, docstring, and the chosen components' hyperparameters) and `reroll list`
(every registry and the presets); `--help` stays free of torch."""

import importlib
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from reroll.catalog import CATALOG, preset_files
from reroll.cli import main
from reroll.cli_info import split_config_args
from reroll.config import RunConfig
from reroll.config_checks import load_checked
from reroll.config_docs import config_keys, describe, field_docs
from reroll.errors import ConfigError


@dataclass
class Example:
    a: int = 1
    """First line.
    Second line."""
    b: str = "x"
    c: float = 2.0
    """Third."""


def test_field_docs_are_the_strings_under_each_field():
    # b has no string under it; a's two lines are dedented and kept
    assert field_docs(Example) == {"a": "First line.\nSecond line.", "c": "Third."}


def test_every_config_key_has_a_docstring():
    undocumented = [k.key for k in config_keys(RunConfig()) if not k.doc]
    assert undocumented == []


def test_version_is_the_package_metadata(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"reroll {version('reroll')}"


def test_config_shows_resolved_value_beside_default_and_component_hyperparameters():
    cfg = load_checked(None, ["train.lr=3e-4", "algo.surrogate_args.clip_high=0.28"])
    text = describe(cfg, only="train.lr")
    assert text.splitlines()[0] == "train.lr: float = 0.0003  (default 0.0001)"
    assert text.splitlines()[1] == "    AdamW learning rate."
    text = describe(cfg, only="algo.surrogate_args")
    assert "hyperparameters of ppo_clip:" in text
    assert "clip_high: float = 0.28 (default 0.2) in [0, inf)" in text
    assert "clip_low: float = 0.2 in [0, 1)" in text  # not overridden: default only


def test_config_names_the_closest_key_when_it_does_not_exist():
    with pytest.raises(ConfigError, match=r"no config key or table 'trian' .*'train'"):
        describe(RunConfig(), only="trian")


def test_config_command_defaults_ignore_the_file(capsys, tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[train]\nlr = 0.5\n")
    assert main(["config", str(f), "train.lr"]) == 0
    assert capsys.readouterr().out.startswith("train.lr: float = 0.5  (default 0.0001)")
    assert main(["config", "--defaults", str(f), "train.lr"]) == 0
    assert capsys.readouterr().out.startswith("train.lr: float = 0.0001\n")


def test_config_arguments_split_into_file_overrides_and_key():
    assert split_config_args(["c.toml", "a.b=1", "train"]) == ("c.toml", ["a.b=1"], "train")
    assert split_config_args(["train"]) == (None, [], "train")
    assert split_config_args(["-", "x=2"]) == ("-", ["x=2"], "")
    with pytest.raises(ConfigError, match="one KEY"):
        split_config_args(["train", "eval"])


def test_list_names_every_registered_component_with_hyperparameters(capsys):
    assert main(["list", "surrogates"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "surrogates (algo.surrogate)"
    assert "  ppo_clip: PPO clip" in out
    assert "      dual_clip: float | None = None in (1, inf)" in out
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for entry in CATALOG:
        for name in entry.registry().names():
            assert f"  {name}:" in out or f"  {name}\n" in out, (entry.kind, name)
    for name in preset_files():
        assert f"  {name}: " in out


def test_every_registry_of_the_package_is_catalogued():
    # a registry added to reroll without a catalogue entry would be missing from `reroll list`
    root = Path(__file__).resolve().parents[1] / "reroll"
    listed = {id(c.registry()) for c in CATALOG}
    missing = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for name in re.findall(r"^(\w+) = Registry\(", path.read_text(), re.M):
            if id(getattr(importlib.import_module(module), name)) not in listed:
                missing.append(f"{module}.{name}")
    assert missing == [], f"add them to reroll.catalog.CATALOG: {missing}"


def test_every_catalogued_key_is_a_config_key():
    keys = {k.key for k in config_keys(RunConfig())}
    for entry in CATALOG:
        assert entry.key is None or entry.key in keys, entry
        assert entry.args_key is None or entry.args_key in keys, entry


def test_help_imports_neither_torch_numpy_nor_a_registry():
    code = ("import sys\nfrom reroll.cli import main\ntry:\n    main(['--help'])\n"
            "except SystemExit:\n    pass\n"
            "print([m for m in sys.modules if m in ('torch', 'numpy') or m.startswith(("
            "'reroll.algo', 'reroll.tasks', 'reroll.control', 'reroll.methods', "
            "'transformers'))])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
