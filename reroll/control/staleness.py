"""Staleness control: AReaL's admission rule as one small pure formula, and the consumption
check. Knows nothing of engines or threads.

Everything is counted in samples (a group of G rollouts is G samples; groups may differ in
size). A group admitted while the policy is at version ``v`` may be trained at trainer
version ``i`` only if ``i - v <= max_staleness``. Admission enforces it: at version ``v`` at
most ``(max_staleness + v + 1) * batch`` samples may have been accepted or be running, so no
sample can start more than ``max_staleness`` versions before the step that consumes it.
``max_staleness = 0`` admits exactly one batch per version: synchronous RL.

Groups finish out of order (a long one is overtaken by short ones admitted after it), so
admission bounds the lag only together with the consumer. Each group has a deadline, the last
trainer version that may consume it (start version + allowed lag); the consumer takes ready
groups earliest deadline first and only while `can_take` says every group with an earlier
deadline, ready or still running, keeps a slot in this step or a later one. Admission leaves
exactly enough room for that when ``overprovision <= 2``, so no group is ever dropped as stale:
a group due by version D started at version <= D - lag, and admission let at most
(D + 1) * batch such samples start (with overprovision, lag is one more and the extra
is at most one batch); at trainer version i, i * batch + (taken this step) are
consumed, which leaves at most (slots left now) + (D - i) * batch_groups due by D, exactly
what `can_take` requires.
"""

from __future__ import annotations

import math


def admission_limit(version: int, *, max_staleness: int, batch: int,
                    overprovision: float = 1.0) -> int:
    """The most samples that may have started (accepted or running) by policy ``version``:
    ``(max_staleness + version + 1) * batch``, plus APRIL's extra
    ``ceil((overprovision - 1) * batch)``. At version 0 it is the most one version may start
    (a group larger than that could never start)."""
    extra = math.ceil((overprovision - 1.0) * batch)
    return (max_staleness + version + 1) * batch + extra


def capacity(version: int, *, max_staleness: int, batch: int, accepted: int,
             running: int, overprovision: float = 1.0) -> int:
    """How many new samples may start now.

    version      current policy version (number of updates applied so far)
    batch        samples consumed by one training step
    accepted     samples of groups that finished and passed the filters (consumed or waiting)
    running      samples of groups started and not finished
    overprovision  APRIL: start this many times a batch's samples; the extra ones finish
                   later and carry over (their lag is allowed one extra version).
    """
    limit = admission_limit(version, max_staleness=max_staleness, batch=batch,
                            overprovision=overprovision)
    return max(0, limit - (accepted + running))


def allowed_lag(*, max_staleness: int, overprovision: float = 1.0) -> int:
    """Largest (trainer version - group start version) a consumed group may have."""
    return max_staleness + (1 if overprovision > 1.0 else 0)


def can_take(deadline: int, *, deadlines: list[int], slots_left: int, trainer_version: int,
             batch: int, size: int = 1, sizes: list[int] | None = None) -> bool:
    """Whether a ready group with ``deadline`` and ``size`` samples may fill ``size`` of this
    step's ``slots_left`` sample slots. ``deadlines`` (with ``sizes``, default 1 each): every
    unconsumed group not yet overdue, ready or running, other than this one.

    Earliest-deadline-first feasibility: for every version D from now up to (not including)
    the group's deadline, the samples due by D must fit in the slots left after this group,
    ``slots_left - size + (D - trainer_version) * batch``. A group due now always may."""
    sizes = sizes if sizes is not None else [1] * len(deadlines)
    for d in {trainer_version, *deadlines}:
        if trainer_version <= d < deadline:
            due = sum(n for x, n in zip(deadlines, sizes) if x <= d)
            if slots_left - size + (d - trainer_version) * batch < due:
                return False
    return True


def referenced_versions(ready: list[set[int]], running_since: list[int], version: int
                        ) -> set[int]:
    """The policy versions unconsumed groups may hold tokens of, at trainer ``version``:
    each ready group's sampled versions (``ready``: one set per group), and for each group
    still in flight every version from the oldest it may carry (``running_since``: its
    start version; -1 counts as 0) up to ``version`` (its records may lag the engine, and
    it may still sample at any version up to the current one)."""
    out = set().union(*ready) if ready else set()
    for since in running_since:
        out.update(range(max(since, 0), version + 1))
    return out
