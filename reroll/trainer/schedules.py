"""Learning-rate schedules (``train.schedule``, ``sft.schedule``), as a registry.

A schedule is a function ``(step, steps) -> factor`` of the 0-based update ``step`` and
the number of updates ``steps`` it may span; `lr_factor` multiplies it by the linear
warm-up. A schedule whose factor depends on ``steps`` (it decays to an end) registers with
the trait ``needs_steps=True``, so that the trainer refuses it without one. Owns the
schedules and the warm-up; must not know the optimiser or the trainer.
"""

from __future__ import annotations

from reroll.registry import Registry

SCHEDULES = Registry("schedule")


@SCHEDULES.register("constant")
def constant(step: int, steps: int) -> float:
    """The full learning rate after the warm-up, whatever the number of updates."""
    return 1.0


@SCHEDULES.register("linear", needs_steps=True)
def linear(step: int, steps: int) -> float:
    """Linear decay reaching 0 at update ``steps`` (TRL's default; here the warm-up ramp
    multiplies the decay instead of preceding it)."""
    return max(0.0, 1.0 - step / max(1, steps))


def _known(schedule: str, key: str) -> None:
    if schedule not in SCHEDULES:
        raise ValueError(f"{key} must be one of {', '.join(SCHEDULES.names())}, "
                         f"got {schedule!r}")


def check_schedule(schedule: str, steps: int, key: str) -> None:
    """Refuse an unknown schedule, or one that needs an end (``needs_steps``) without it;
    ``key`` names the config key in the message."""
    _known(schedule, key)
    if SCHEDULES.trait(schedule, "needs_steps", False) and steps <= 0:
        raise ValueError(f"{key} = \"{schedule}\" needs the number of updates it decays "
                         f"over (total_steps), got {steps}")


def lr_factor(step: int, *, steps: int, warmup_steps: int, schedule: str,
              key: str = "sft.schedule") -> float:
    """Multiplier of the base learning rate at 0-based ``step``: linear warm-up over
    ``warmup_steps`` (step 0 gets 1/warmup), times the schedule's factor. Used by SFT and
    by the RL trainer (``key`` names the config key in the error)."""
    _known(schedule, key)
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    return warm * SCHEDULES.get(schedule)(step, steps)
