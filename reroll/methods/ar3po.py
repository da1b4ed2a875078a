"""AR3PO (Zhang et al. 2025, "Improving Sampling Efficiency in RLVR through Adaptive Rollout
and Response Reuse"). Rule in one line: a prompt gets ``k`` responses per stage and another
stage only while none of its responses is correct (at most ``max_stages``), and a group
still without a correct response after its last stage gets a past correct response of its
prompt in place of one member, so it has reward variance.

The method is the two parts together: ``preset = "ar3po"`` (configs/presets/ar3po.toml)
turns on this module's staged allocator and the response reuse (``replay.reuse``, the bank
of `reroll.replay.bank`). The staged allocator alone is ``control.allocator =
"ar3po_stages"``: reroll's name for half of the method (benchmark rows that ran only it say
so).

Where reroll differs: the stages are rounds of one group (the allocator's ``more``),
decided as each round is scored; the reused answer replaces the group's last member (the
group keeps its size) and keeps its behaviour log-probs, so the configured off-policy
correction weighs it (the paper leaves its off-policy handling open).

Owns the rule (`ar3po_more`) and the ``ar3po_stages`` allocator.
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


@ALLOCATORS.register("ar3po_stages", ranges={"k": "[1, inf)", "max_stages": "[1, inf)"})
class AR3PO(Allocator):
    """AR3PO's staged sampling alone (the method is ``preset = "ar3po"``, which adds the
    response reuse): ``k`` samples per stage; another stage only while the group has no
    correct sample, at most ``max_stages`` stages. Easy prompts stop after one stage."""

    def __init__(self, group_size: int, /, *, k: int = 2, max_stages: int = 4):
        super().__init__(group_size)
        if k < 1 or max_stages < 1:
            raise ValueError(f"allocator 'ar3po_stages': k and max_stages must be >= 1, got "
                             f"{k}, {max_stages}")
        self.k, self.max_stages = k, max_stages

    def initial(self, prompt):
        return self.k

    def more(self, prompt, values, successes, rounds):
        return ar3po_more(successes, len(values), rounds - 1, k=self.k,
                          max_stages=self.max_stages)

    def max_size(self):
        return self.k * self.max_stages
