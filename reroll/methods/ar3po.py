"""AR3PO: staged sampling. A prompt gets ``k`` responses per stage and another stage only
while none of its responses is correct, up to ``max_stages`` stages, so easy prompts stop
after one stage and the budget goes to the hard ones. Where reroll differs: the stages are
rounds of one group (the allocator's ``more``), decided as each round is scored.

Owns the rule (`ar3po_more`) and the ``ar3po`` allocator.
"""

from __future__ import annotations

from reroll.control.allocators import ALLOCATORS, Allocator
from reroll.control.rules import fail, ranged


@ranged(k="[1, inf)", max_stages="[1, inf)", n_so_far="[0, inf)", n_correct="[0, inf)",
        stage="[0, inf)")
def ar3po_more(n_correct: int, n_so_far: int, stage: int, *, k: int, max_stages: int) -> int:
    """How many responses to add after ``stage`` (stage 0 is the initial ``k`` samples): ``k
    if n_correct == 0 and stage + 1 < max_stages else 0``. ``stage >= max_stages`` is an
    error (that stage should never have run)."""
    if n_correct > n_so_far:
        raise fail("ar3po_more", "n_correct", f"<= n_so_far ({n_so_far})", n_correct)
    if stage >= max_stages:
        raise fail("ar3po_more", "stage", f"< max_stages ({max_stages})", stage)
    return k if n_correct == 0 and stage + 1 < max_stages else 0


@ALLOCATORS.register("ar3po", ranges={"k": "[1, inf)", "max_stages": "[1, inf)"})
class AR3PO(Allocator):
    """AR3PO staged sampling: ``k`` samples per stage; another stage only while the group has
    no correct sample, at most ``max_stages`` stages. Easy prompts stop after one stage."""

    def __init__(self, group_size: int, /, *, k: int = 2, max_stages: int = 4):
        super().__init__(group_size)
        if k < 1 or max_stages < 1:
            raise ValueError(f"allocator 'ar3po': k and max_stages must be >= 1, got "
                             f"{k}, {max_stages}")
        self.k, self.max_stages = k, max_stages

    def initial(self, prompt):
        return self.k

    def more(self, prompt, values, successes, rounds):
        return ar3po_more(successes, len(values), rounds - 1, k=self.k,
                          max_stages=self.max_stages)

    def max_size(self):
        return self.k * self.max_stages
