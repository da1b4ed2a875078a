"""Reward composition: several verifiers, each with a weight, as one reward.

Owns building the components from config specs (``reward.verifiers``: a list of
``{name, weight=1.0, args={}}``; empty means the task's default spec) and turning their
scores into a scalar. Must not know where scoring runs (``reroll.verifiers.pool`` does).

Component names are unique: the first use of a verifier keeps its name, later ones become
``name_2``, ``name_3``, ... A component that raises becomes an error Score naming it. The
scalar is the weighted sum of the values, or None when any component errored (a broken
verifier must never look like a wrong answer). The per-component scores stay visible for
estimators that need them (GDPO normalises each component separately).
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from reroll.rollout import Example, Rollout, Score
from reroll.verifiers.base import VERIFIERS, Verifier

SPEC_KEYS = ("name", "weight", "args")


@dataclass
class Component:
    name: str  # unique within the reward
    verifier: Verifier
    weight: float = 1.0
    spec: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """How messages name it: its name and arguments, e.g. ``'python' (fn='m:f')``."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.spec.get("args", {}).items())
        return f"{self.name!r}" + (f" ({args:.100})" if args else "")


def check_spec(spec: Any, where: str) -> dict[str, Any]:
    """A spec normalised to ``{name, weight, args}``; a clear error naming ``where``."""
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: a reward spec is a dict {{name, weight, args}}, got {spec!r}")
    extra = set(spec) - set(SPEC_KEYS)
    if "name" not in spec or extra:
        raise ValueError(f"{where}: expects keys name, weight, args; got {sorted(spec)}")
    weight = spec.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight):
        raise ValueError(f"{where}: weight must be a finite number, got {weight!r}")
    args = spec.get("args", {}) or {}
    if not isinstance(args, dict):
        raise ValueError(f"{where}: args must be a dict, got {args!r}")
    return {"name": spec["name"], "weight": float(weight), "args": dict(args)}


def score_one(comp: Component, rollout: Rollout, example: Example) -> Score:
    """One component's Score, named after the component; an exception is an error Score."""
    t0 = time.perf_counter()
    try:
        s = comp.verifier(rollout, example)
        if not isinstance(s, Score):
            raise TypeError(f"verifier returned {type(s).__name__}, expected Score")
    except Exception as e:
        s = Score(name=comp.name, error=f"verifier {comp.label} raised {type(e).__name__}: {e}",
                  info={"traceback": traceback.format_exc(limit=-4)})
    s.name = comp.name
    s.latency_s = time.perf_counter() - t0
    return s


class Reward:
    """Weighted verifiers. ``reward(rollout, example) -> list[Score]`` (one per component,
    in order); ``reward.combine(scores) -> float | None``."""

    def __init__(self, components: list[Component]):
        if not components:
            raise ValueError("a reward needs at least one verifier")
        names = [c.name for c in components]
        if len(set(names)) != len(names):
            raise ValueError(f"reward component names must be unique, got {names}")
        self.components = components

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.components]

    @property
    def weights(self) -> dict[str, float]:
        return {c.name: c.weight for c in self.components}

    def __call__(self, rollout: Rollout, example: Example) -> list[Score]:
        return [score_one(c, rollout, example) for c in self.components]

    def combine(self, scores: list[Score]) -> float | None:
        """Weighted sum of the component values; None if any component errored."""
        by_name = {s.name: s for s in scores}
        missing = [n for n in self.names if n not in by_name]
        if missing:
            raise ValueError(f"scores lack reward component(s) {missing}; got {list(by_name)}")
        if any(not by_name[n].ok for n in self.names):
            return None
        return sum(c.weight * float(by_name[c.name].value) for c in self.components)  # type: ignore[arg-type]


def build_reward(specs: list[dict], default: dict) -> Reward:
    """The Reward for ``specs`` (``reward.verifiers``), or for ``[default]`` (the
    task's default verifier spec) when ``specs`` is empty. Builds every verifier now, so a
    bad name, hyperparameter or import fails here with the spec's position."""
    use = list(specs) if specs else [default]
    label = "reward.verifiers" if specs else "task default verifier"
    components: list[Component] = []
    counts: dict[str, int] = {}
    for i, raw in enumerate(use):
        where = f"{label}[{i}]" if specs else label
        spec = check_spec(raw, where)
        factory = VERIFIERS.bind(spec["name"], spec["args"], where)
        try:
            verifier = factory()
        except (ValueError, TypeError) as e:
            raise ValueError(f"{where}: {e}") from None
        counts[spec["name"]] = counts.get(spec["name"], 0) + 1
        n = counts[spec["name"]]
        name = spec["name"] if n == 1 else f"{spec['name']}_{n}"
        components.append(Component(name=name, verifier=verifier, weight=spec["weight"],
                                    spec=spec))
    return Reward(components)
