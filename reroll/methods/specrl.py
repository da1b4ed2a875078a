"""SPEC-RL (Liu et al. 2025, "SPEC-RL: Accelerating On-Policy Reinforcement Learning via
Speculative Rollouts"; reference code github.com/ShopeeLLM/Spec-RL, whose verification is
``spec_cut`` / ``spec_cut_with_knobs`` in ``verl/utils/speculative_decoding.py`` (the kept
prefix made the next context by ``build_ctx`` there, called from ``RayPPOTrainer.fit`` in
``verl/trainer/ppo/ray_trainer.py``)): speculative rollouts.
Rule in one line: an earlier epoch's response to the same prompt is a draft, each token kept
with probability ``min(1, lenience * p / q)``, and generation resumes from the whole current
policy at the first rejected position.

A prompt seen in an earlier epoch already has responses from a slightly older policy; the
new rollout takes one as a draft, the current policy verifies it token by token (p the
current policy's probability, q the one recorded when the draft was sampled) and generates
only from the first rejection on, so the verified prefix costs one forward instead of one
decode step a token. ``lenience`` > 1 keeps more of the draft at a larger bias.

``resample`` says what the first rejected position is drawn from
(`reroll.engine.speculative`): ``"full"`` (the default, the paper's rule) from the whole
current distribution, as the reference does by cutting the draft there and generating on;
``"residual"`` (reroll's variant) from the current distribution without the drafted token,
the standard speculative-sampling residual for a deterministic draft. Neither is exact for
a sampled draft (the exact residual needs all of q, the draft records q of its own token
only); ``"full"`` also favours the drafted token, ``"residual"`` does not.

Where reroll differs: sample ``i`` of a group drafts from response ``i`` (cyclically) of the
prompt's group consumed last time, and the draft store changes only at step boundaries (so
drafts repeat exactly and resume from checkpoints). The engine
(`reroll.engine.speculative`) verifies; this module only proposes.

Owns the ``spec_rl`` drafter.
"""

from __future__ import annotations

from reroll.replay.drafts import DRAFTERS, DraftStore
from reroll.rollout import Draft, Rollout


@DRAFTERS.register("spec_rl", ranges={"lenience": "[1, inf)", "resample": "{full, residual}"})
class SpecRL:
    """Last time's response to the same prompt, with its recorded log-probs (SPEC-RL); the
    first rejected position is drawn by ``resample`` ("full": SPEC-RL's rule)."""

    def __init__(self, *, lenience: float = 1.0, resample: str = "full"):
        self.lenience = lenience
        self.resample = resample
        self.store = DraftStore(history=1)

    def draft(self, r: Rollout) -> Draft | None:
        prev = self.store.latest(r.prompt_id)
        if not prev:
            return None
        tokens, logprobs, sid = prev[r.index_in_group % len(prev)]
        return Draft(tuple(tokens), tuple(logprobs), self.lenience, source=sid,
                     resample=self.resample)
