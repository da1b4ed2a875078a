"""Staleness control: AReaL's admission rule as one small pure formula, and the consumption
check. Knows nothing of engines or threads.

A group admitted while the policy is at version ``v`` may be trained at trainer version ``i``
only if ``i - v <= max_staleness``. Admission enforces it: at version ``v`` at most
``(max_staleness + v + 1) * batch_groups`` groups may have been accepted or be running, so no
group can start more than ``max_staleness`` versions before the step that consumes it.
``max_staleness = 0`` admits exactly one batch per version: synchronous RL.

Groups finish out of order (a long one is overtaken by short ones admitted after it), so
admission bounds the lag only together with the consumer. Each group has a deadline, the last
trainer version that may consume it (start version + allowed lag); the consumer takes ready
groups earliest deadline first and only while `can_take` says every group with an earlier
deadline, ready or still running, keeps a slot in this step or a later one. Admission leaves
exactly enough room for that when ``overprovision <= 2``, so no group is ever dropped as stale:
a group due by version D started at version <= D - lag, and admission let at most
(D + 1) * batch_groups such groups start (with overprovision, lag is one more and the extra
is at most one batch); at trainer version i, i * batch_groups + (taken this step) are
consumed, which leaves at most (slots left now) + (D - i) * batch_groups due by D, exactly
what `can_take` requires.
"""

from __future__ import annotations

import math


def capacity(version: int, *, max_staleness: int, batch_groups: int, accepted: int,
             running: int, overprovision: float = 1.0) -> int:
    """How many new groups may start now.

    version      current policy version (number of updates applied so far)
    accepted     groups that finished and passed the filters (consumed or waiting)
    running      groups started and not finished
    overprovision  APRIL: start this many times a batch's groups; the extra ones finish
                   later and carry over (their lag is allowed one extra version).
    """
    extra = math.ceil((overprovision - 1.0) * batch_groups)
    limit = (max_staleness + version + 1) * batch_groups + extra
    return max(0, limit - (accepted + running))


def allowed_lag(*, max_staleness: int, overprovision: float = 1.0) -> int:
    """Largest (trainer version - group start version) a consumed group may have."""
    return max_staleness + (1 if overprovision > 1.0 else 0)


def can_take(deadline: int, *, deadlines: list[int], slots_left: int, trainer_version: int,
             batch_groups: int) -> bool:
    """Whether a ready group with ``deadline`` may fill one of this step's ``slots_left``
    slots. ``deadlines``: those of every unconsumed group not yet overdue, ready or running.

    Earliest-deadline-first feasibility: for every version D from now up to (not including)
    the group's deadline, the groups due by D must fit in the slots left after this one,
    ``slots_left - 1 + (D - trainer_version) * batch_groups``. A group due now always may."""
    for d in {trainer_version, *deadlines}:
        if trainer_version <= d < deadline:
            due = sum(1 for x in deadlines if x <= d)
            if slots_left - 1 + (d - trainer_version) * batch_groups < due:
                return False
    return True
