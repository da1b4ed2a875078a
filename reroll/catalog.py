"""The catalogue of registries: which ones exist, where each lives, and which config key
chooses from it (and which key holds the chosen component's hyperparameters). Lets
`reroll list` and `reroll config` describe every registered component without knowing any
of them; a registry is imported only when it is asked for (most import torch).

Owns the table and the description of a component (summary line, hyperparameters with
annotation, default and declared range). Must not know what any component does.
"""

from __future__ import annotations

import importlib
import inspect
import textwrap
from dataclasses import dataclass
from pathlib import Path

from reroll.registry import Registry


@dataclass(frozen=True)
class Catalogued:
    kind: str
    """Plural name, as `reroll list KIND` takes it."""
    module: str
    """Module whose import registers every built-in component of the registry."""
    attr: str
    """The registry's name in that module."""
    key: str | None = None
    """Config key that chooses a component (None: chosen by the wiring, not by a key)."""
    args_key: str | None = None
    """Config key holding the chosen component's hyperparameters."""
    many: bool = False
    """The key holds a list of ``{name, args}`` tables (several components at once)."""

    def registry(self) -> Registry:
        return getattr(importlib.import_module(self.module), self.attr)


CATALOG = [
    Catalogued("advantages", "reroll.algo", "ADVANTAGES", "algo.advantage",
               "algo.advantage_args"),
    Catalogued("surrogates", "reroll.algo", "SURROGATES", "algo.surrogate",
               "algo.surrogate_args"),
    Catalogued("aggregations", "reroll.algo", "AGGREGATIONS", "algo.aggregation",
               "algo.aggregation_args"),
    Catalogued("kl", "reroll.algo", "KL_ESTIMATORS", "algo.kl"),
    Catalogued("corrections", "reroll.algo", "CORRECTIONS", "algo.correction",
               "algo.correction_args"),
    Catalogued("ess_rules", "reroll.methods.vcpo", "LR_RULES", "algo.ess_rule"),
    Catalogued("schedules", "reroll.trainer.schedules", "SCHEDULES", "train.schedule"),
    Catalogued("step_hooks", "reroll.trainer.optim_step", "STEP_HOOKS"),
    Catalogued("verifiers", "reroll.verifiers", "VERIFIERS", "reward.verifiers", many=True),
    Catalogued("tasks", "reroll.tasks", "TASKS", "task.name", "task.args"),
    Catalogued("workflows", "reroll.workflows", "WORKFLOWS", "rollout.workflow"),
    Catalogued("tree_branches", "reroll.workflows.tree", "TREE_BRANCHES", "rollout.tree_branch"),
    Catalogued("tree_credits", "reroll.algo.tree_credit", "TREE_CREDITS", "rollout.tree_credit"),
    Catalogued("envs", "reroll.envs", "ENVIRONMENTS", "rollout.env", "rollout.env_args"),
    Catalogued("engines", "reroll.engine", "ENGINES", "engine.name"),
    Catalogued("servers", "reroll.engine", "SERVERS", "engine.server"),
    Catalogued("allocators", "reroll.control.allocators", "ALLOCATORS", "control.allocator",
               "control.allocator_args"),
    Catalogued("selectors", "reroll.control.selectors", "SELECTORS", "control.selector",
               "control.selector_args"),
    Catalogued("lengths", "reroll.control.lengths", "LENGTHS", "control.length",
               "control.length_args"),
    Catalogued("pruners", "reroll.control.pruners", "PRUNERS", "control.pruner",
               "control.pruner_args"),
    Catalogued("shapers", "reroll.control.shapers", "SHAPERS"),
    Catalogued("filters", "reroll.control.filters", "FILTERS"),
    Catalogued("drafters", "reroll.replay.drafts", "DRAFTERS", "replay.draft",
               "replay.draft_args"),
]
BY_KIND = {c.kind: c for c in CATALOG}
BY_KEY = {c.key: c for c in CATALOG if c.key}


@dataclass(frozen=True)
class Hyperparameter:
    name: str
    annotation: str
    """As written in the component's signature ("" when unannotated)."""
    default: str
    """``repr`` of the default; "required" when it has none."""
    range: str
    """Declared valid interval ("" when none)."""


def summary(obj: object) -> str:
    """The first paragraph of a docstring, on one line ("" when there is none)."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n")[0].split())


def wrapped(text: str, indent: int, width: int = 92) -> str:
    """``text`` filled to ``width`` at ``indent`` spaces, continuation lines 2 further in."""
    pad = " " * indent
    return textwrap.fill(text, width, initial_indent=pad, subsequent_indent=pad + "  ")


def hyperparameters(registry: Registry, name: str) -> list[Hyperparameter]:
    ranges = registry.ranges(name)
    out = []
    for p in registry.hyperparameters(name).values():
        ann = "" if p.annotation is p.empty else (
            p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(
                p.annotation))
        default = "required" if p.default is p.empty else repr(p.default)
        rng = ranges[p.name].text if p.name in ranges else ""
        out.append(Hyperparameter(p.name, ann, default, rng))
    return out


def format_hyperparameter(h: Hyperparameter, value: object = inspect.Parameter.empty) -> str:
    """``clip_high: float = 0.28 (default 0.2) in [0, inf)``; ``value`` is the configured
    one, shown beside the default when it differs."""
    text = h.name + (f": {h.annotation}" if h.annotation else "")
    if value is not inspect.Parameter.empty and repr(value) != h.default:
        text += f" = {value!r} (default {h.default})"
    else:
        text += f" = {h.default}"
    return text + (f" in {h.range}" if h.range else "")


def preset_files() -> dict[str, Path]:
    """Preset name -> file, from the package's configs/presets then the working directory's
    (the first found wins, as `reroll.config.preset_path` looks them up)."""
    from reroll.config import REPO_ROOT

    out: dict[str, Path] = {}
    for root in (REPO_ROOT / "configs" / "presets", Path.cwd() / "configs" / "presets"):
        for p in sorted(root.glob("*.toml")) if root.is_dir() else []:
            out.setdefault(p.stem, p)
    return out


def preset_summary(path: Path) -> str:
    """A preset file's leading comment, on one line."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(x for x in lines if x)
