"""Group filters (pure): which complete groups are worth training on, and why others are not.

Owns the ``FILTERS`` registry. Every entry has the signature

    fn(group_values: Sequence[Sequence[float]], *, hyperparams) -> list[str | None]

one decision per group: ``None`` keeps the group, a short reason string (a metric key the loop
counts) drops it. ``group_values`` holds, per group, the per-sample metric the filter looks at
(DAPO uses correctness, not the shaped reward). Over-sampling until enough groups survive is
the loop's job. Must not know about rollouts, torch or the scheduler. DAPO's dynamic sampling: docs/algorithms.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from reroll.registry import Registry

FILTERS = Registry("filter")


@FILTERS.register("zero_variance", ranges={"tol": "[0, inf)"})
def zero_variance(group_values: Sequence[Sequence[float]], *, tol: float = 0.0
                  ) -> list[str | None]:
    """DAPO dynamic sampling: drop a group whose values are all equal (max - min <= tol), since
    every member then has advantage 0 and the group gives no gradient. Singleton groups are
    kept (their spread is undefined, not zero). Reasons: ``zero_variance``; an empty group is
    dropped as ``empty_group``.
    """
    if tol < 0:
        raise ValueError(f"filter 'zero_variance': tol must be >= 0, got {tol}")
    out: list[str | None] = []
    for i, values in enumerate(group_values):
        vals = [float(v) for v in values]
        if any(math.isnan(v) for v in vals):
            raise ValueError(f"filter 'zero_variance': group {i} has a NaN value: {vals}")
        if not vals:
            out.append("empty_group")
        elif len(vals) > 1 and max(vals) - min(vals) <= tol:
            out.append("zero_variance")
        else:
            out.append(None)
    return out
