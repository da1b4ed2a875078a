"""Allocators: how many samples each prompt gets. ``fixed`` (plain GRPO) is here; the
adaptive ones are methods (`reroll.methods`: AR3PO, DARS, XRPO, Rollout-GDRO, DUET).

Owns the ``ALLOCATORS`` registry. An allocator is built as ``cls(group_size, *,
hyperparameters)`` (``group_size`` is ``rollout.group_size``, the mean budget N) and answers
three questions:

- ``initial(prompt)``: samples of the first round of a new group;
- ``more(prompt, values, successes, rounds)``: after ``rounds`` rounds, whose members scored
  ``values`` (``successes`` of them counted correct), how many to add now (0 closes the group);
- ``max_size()``: the most a group can reach, which admission reserves for it.

``prompt`` is the prompt's `PromptRecord` (None when unseen), as of the last step boundary.
``end_step(outcomes, stats)`` runs at each step boundary with the consumed groups' ``(prompt,
size, successes)`` in consumption order: the only place cross-prompt state (a shadow price)
changes, so a resumed run decides exactly what an uninterrupted one did. ``state`` /
``load_state`` carry that state through checkpoints. `ShadowPriced` is the shared base of
the allocators that meet a mean budget through a price. Knows nothing of engines,
workflows, the scheduler or any method.
"""

from __future__ import annotations

from reroll.control.rules import dual_step
from reroll.control.stats import PromptRecord, PromptStats
from reroll.registry import METHODS, Registry

ALLOCATORS = Registry("allocator", plugins=METHODS)
Outcome = tuple[str, int, int]  # (prompt_id, samples, successes) of one consumed group


class Allocator:
    """Fixed n: every group gets ``group_size`` samples in one round (plain GRPO)."""

    def __init__(self, group_size: int, /):
        if group_size < 1:
            raise ValueError(f"allocator: group_size must be >= 1, got {group_size}")
        self.group_size = group_size

    def initial(self, prompt: PromptRecord | None) -> int:
        return self.group_size

    def more(self, prompt: PromptRecord | None, values: list[float], successes: int,
             rounds: int) -> int:
        return 0

    def max_size(self) -> int:
        return self.group_size

    def end_step(self, outcomes: list[Outcome], stats: PromptStats) -> None:
        pass

    def state(self) -> dict:
        return {}

    def load_state(self, d: dict) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        """What to log about the allocator's own state."""
        return {}


ALLOCATORS.register("fixed")(Allocator)


class ShadowPriced(Allocator):
    """An allocator that meets a mean budget of ``group_size`` samples per group on average
    through a shadow price ``mu`` on samples, moved by projected dual ascent at each step
    boundary from the realised mean group size (`rules.dual_step`)."""

    def __init__(self, group_size: int, mu: float, lr: float):
        super().__init__(group_size)
        self.mu, self.lr = mu, lr

    def end_step(self, outcomes, stats):
        if outcomes:
            mean = sum(n for _, n, _ in outcomes) / len(outcomes)
            self.mu = dual_step(self.mu, mean, self.group_size, lr=self.lr)

    def state(self):
        return {"mu": self.mu}

    def metrics(self):
        return {"control/price": self.mu}

    def load_state(self, d):
        self.mu = float(d.get("mu", self.mu))
