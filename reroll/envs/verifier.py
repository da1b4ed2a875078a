"""A single-turn task as a one-turn environment: the policy answers once, the configured
verifiers judge the answer, the episode ends. It is how a single-turn task runs through the
multi-turn workflow (and the check that both workflows agree: same tokens, same reward).

Errors are data: a verifier that fails makes the step raise, which the workflow records as
this sample's error score, never as a 0.
"""

from __future__ import annotations

from reroll.envs.base import ENVIRONMENTS, StepResult
from reroll.rollout import Example, Rollout


@ENVIRONMENTS.register("verifier")
class VerifierEnv:
    """One turn scored by ``verifiers`` (a list of {name, weight, args} specs, as in
    ``reward.verifiers``); the reward is their weighted sum."""

    stop_strings: list[str] = []

    def __init__(self, *, verifiers: list[dict]):
        from reroll.verifiers.combine import build_reward

        self.reward = build_reward(list(verifiers), {})
        self.example: Example | None = None

    def reset(self, example: Example) -> str:
        self.example = example
        return ""

    def step(self, action: str) -> StepResult:
        ex = self.example
        r = Rollout(prompt_id=ex.prompt_id, group_id="env", tokens=[], prompt_len=0,
                    completion=action)
        scores = self.reward(r, ex)
        value = self.reward.combine(scores)
        if value is None:
            raise RuntimeError("; ".join(s.error for s in scores if not s.ok))
        return StepResult(reward=value, done=True,
                          info={s.name: s.value for s in scores})
