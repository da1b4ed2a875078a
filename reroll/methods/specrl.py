"""SPEC-RL: speculative rollouts. A prompt seen in an earlier epoch already has responses
from a slightly older policy; the new rollout takes one as a draft, the current policy
verifies it token by token (a token is kept with probability ``min(1, lenience * p / q)``, p
the current policy's probability, q the one recorded when the draft was sampled) and
generates only from the first rejection on, so the verified prefix costs one forward
instead of one decode step a token. ``lenience`` > 1 keeps more of the draft at a larger bias.

Where reroll differs: sample ``i`` of a group drafts from response ``i`` (cyclically) of the
prompt's group consumed last time, and the draft store changes only at step boundaries (so
drafts repeat exactly and resume from checkpoints). At the first rejection the engine
samples from the residual, which knows only q of the drafted token, so the policy's
distribution is kept approximately; SPEC-RL re-samples from p there. The engine
(`reroll.engine.speculative`) verifies; this module only proposes.

Owns the ``spec_rl`` drafter.
"""

from __future__ import annotations

from reroll.replay.drafts import DRAFTERS, DraftStore
from reroll.rollout import Draft, Rollout


@DRAFTERS.register("spec_rl", ranges={"lenience": "[1, inf)"})
class SpecRL:
    """Last time's response to the same prompt, with its recorded log-probs (SPEC-RL)."""

    def __init__(self, *, lenience: float = 1.0):
        self.lenience = lenience
        self.store = DraftStore(history=1)

    def draft(self, r: Rollout) -> Draft | None:
        prev = self.store.latest(r.prompt_id)
        if not prev:
            return None
        tokens, logprobs, sid = prev[r.index_in_group % len(prev)]
        return Draft(tuple(tokens), tuple(logprobs), self.lenience, source=sid)
