"""Staleness control: AReaL's admission rule as one small pure formula, and the consumption
check. Knows nothing of engines or threads.

A group admitted while the policy is at version ``v`` may be trained at trainer version ``i``
only if ``i - v <= max_staleness``. Admission enforces it: at version ``v`` at most
``(max_staleness + v + 1) * batch_groups`` groups may have been accepted or be running, so no
group can start more than ``max_staleness`` versions before the step that consumes it.
``max_staleness = 0`` admits exactly one batch per version: synchronous RL.

Groups finish out of order (a long one is overtaken by short ones admitted after it), so
admission alone bounds the lag only together with the consumer: ``Scheduler.take`` hands out
groups at their last admissible version first and holds slots for the ones still running.
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


def is_stale(trainer_version: int, start_version: int, *, max_staleness: int,
             overprovision: float = 1.0) -> bool:
    lag = trainer_version - start_version
    return lag > allowed_lag(max_staleness=max_staleness, overprovision=overprovision)
