"""What the run report plots, computed from a run directory's files: metric series by step
and by wall time, held-out accuracy with its Wilson interval, response-length quantiles per
recorded step, the token share per staleness lag, the mean time split, drop reasons, and
the rollouts sampled for the table. Pure reading and arithmetic; no plotting library.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from reroll.runlog import read_metrics, read_rollouts


@dataclass
class Run:
    name: str
    path: Path
    rows: list[dict]
    """metrics.jsonl, in order."""
    rollouts: list[tuple[int, dict]] = field(default_factory=list)
    """rollouts.jsonl: (step, group dict)."""

    def has(self, key: str) -> bool:
        return any(key in r for r in self.rows)

    def series(self, key: str, x: str = "step") -> tuple[list[float], list[float]]:
        """(x, y) of the rows holding ``key`` (and ``x``; "time" is seconds since start)."""
        pts = [(r[x], r[key]) for r in self.rows if key in r and x in r
               and isinstance(r[key], (int, float))]
        return [p[0] for p in pts], [p[1] for p in pts]

    def keys(self, pattern: str) -> list[str]:
        """Metric keys matching a regular expression, sorted."""
        rx = re.compile(pattern)
        return sorted({k for r in self.rows for k in r if rx.fullmatch(k)})


def reward_keys(run: Run) -> list[tuple[str, str]]:
    """The reward curve's (key, label) pairs: the reward, and train accuracy only where it
    differs from the reward (a binary reward makes the two one curve)."""
    same = all(r.get("reward/accuracy") == r.get("reward/mean") for r in run.rows)
    if same:
        return [("reward/mean", "reward (= train accuracy)")]
    return [("reward/mean", "reward"), ("reward/accuracy", "train accuracy")]


def moving_average(ys: list[float], window: int) -> list[float]:
    """The mean of each value and the up to ``window - 1`` values before it."""
    out = []
    for i in range(len(ys)):
        part = ys[max(0, i - window + 1): i + 1]
        out.append(sum(part) / len(part))
    return out


def run_names(paths: list[Path]) -> list[str]:
    """The shortest path suffixes that tell the runs apart (``a/rl`` and ``b/rl``)."""
    parts = [p.resolve().parts for p in paths]
    for n in range(1, max(len(x) for x in parts) + 1):
        names = ["/".join(x[-n:]) for x in parts]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]


def load_runs(paths: list[str | Path]) -> list[Run]:
    paths = [Path(p) for p in paths]
    runs = []
    for p, name in zip(paths, run_names(paths)):
        rows = read_metrics(p)
        if not rows:
            raise FileNotFoundError(f"{p} has no metrics.jsonl rows (is it a run directory?)")
        runs.append(Run(name, p, rows, read_rollouts(p)))
    return runs


def wilson(p: float, n: float, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion ``p`` observed on ``n`` trials (95%
    at z = 1.96); (0, 1) when n = 0."""
    if n <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class EvalPoints:
    x: list[float]
    acc: list[float]
    low: list[float]
    high: list[float]
    n: list[int]


def eval_points(run: Run, x: str = "step", key: str = "eval/greedy_accuracy") -> EvalPoints:
    """Held-out accuracy with its Wilson interval, from ``eval/n_examples`` of each row."""
    pts = EvalPoints([], [], [], [], [])
    for r in run.rows:
        if key in r and x in r:
            n = int(r.get("eval/n_examples", 0))
            lo, hi = wilson(r[key], n)
            pts.x.append(r[x])
            pts.acc.append(r[key])
            pts.low.append(lo)
            pts.high.append(hi)
            pts.n.append(n)
    return pts


def quantile(xs: list[float], q: float) -> float:
    """Linear-interpolated quantile of a non-empty list (numpy's default rule)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def sampled_length(rollout: dict) -> int:
    """Policy-sampled tokens of a recorded rollout (environment tokens not counted)."""
    return sum(rollout["loss_mask"]) if "loss_mask" in rollout else len(rollout["tokens"])


def length_quantiles(run: Run, qs: tuple[float, ...] = (0.1, 0.5, 0.9)
                     ) -> tuple[list[int], list[list[float]]]:
    """Per recorded step, the quantiles ``qs`` of its samples' response lengths:
    (steps, [values of each quantile])."""
    by_step: dict[int, list[int]] = {}
    for step, g in run.rollouts:
        by_step.setdefault(step, []).extend(sampled_length(r) for r in g["rollouts"])
    steps = sorted(s for s in by_step if by_step[s])
    return steps, [[quantile(by_step[s], q) for s in steps] for q in qs]


def lag_shares(run: Run) -> dict[int, float]:
    """Mean over steps of the share of trained tokens at each policy lag
    (``staleness/token_share_lag{k}``; a step without a lag's key counts 0 for it)."""
    keys = run.keys(r"staleness/token_share_lag\d+")
    rows = [r for r in run.rows if any(k in r for k in keys)]
    if not rows:
        return {}
    return {int(k.rsplit("lag", 1)[1]): sum(r.get(k, 0.0) for r in rows) / len(rows)
            for k in keys}


TIME_SPLIT = [("time/generate_s", "generate"), ("time/score_latency_s", "score latency (a sample)"),
              ("time/train_s", "train"), ("time/wait_for_rollouts_s", "wait for rollouts"),
              ("time/eval_s", "evaluate (an evaluation)")]


def time_split(run: Run) -> dict[str, float]:
    """Mean seconds of each part of the time split that was recorded, over the logged rows
    holding it: per step, except a sample's scoring latency and an evaluation's time."""
    out = {}
    for key, label in TIME_SPLIT:
        _, ys = run.series(key)
        if ys:
            out[label] = sum(ys) / len(ys)
    return out


def last_counts(run: Run, prefix: str) -> dict[str, float]:
    """The last logged value of each cumulative counter under ``prefix`` (drop reasons,
    score errors), by the key's remainder."""
    out: dict[str, float] = {}
    for r in run.rows:
        for k, v in r.items():
            if k.startswith(prefix):
                out[k[len(prefix):]] = v
    return out


def sample_groups(run: Run, n_steps: int = 4, groups_per_step: int = 1
                  ) -> list[tuple[int, dict]]:
    """Recorded groups spread over the run: the first ``groups_per_step`` groups of
    ``n_steps`` recorded steps evenly spaced from the first to the last."""
    steps = sorted({s for s, _ in run.rollouts})
    if not steps:
        return []
    idx = sorted({round(i * (len(steps) - 1) / max(1, n_steps - 1))
                  for i in range(min(n_steps, len(steps)))})
    chosen = {steps[i] for i in idx}
    out, taken = [], {s: 0 for s in chosen}
    for s, g in run.rollouts:
        if s in chosen and taken[s] < groups_per_step:
            out.append((s, g))
            taken[s] += 1
    return out
