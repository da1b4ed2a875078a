"""Countdown with feedback: reach the target from the given numbers, with several tries.
Each policy turn is an expression followed by a newline (the stop string); the environment
says why a try fails ("invalid\n" for an expression it cannot parse, "use 3 5 2\n" when the
numbers are not exactly the given ones, "=23\n" for a valid expression with another value)
and the policy tries again, until it is right (reward 1) or the turns run out.

Step info: ``invalid``, ``wrong_numbers``, ``wrong_value``, ``solved``.
"""

from __future__ import annotations

import random

from reroll.envs.base import ENVIRONMENTS, StepResult
from reroll.rollout import Example
from reroll.tasks.countdown import random_expression
from reroll.tasks.expr import ExprError, parse


def _value(v) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


@ENVIRONMENTS.register("countdown_feedback", ranges={"demo_retry_share": "[0, 1]"})
class CountdownFeedback:
    stop_strings = ["\n"]

    def __init__(self, *, demo_retry_share: float = 0.3):
        if not 0.0 <= demo_retry_share <= 1.0:
            raise ValueError(f"countdown_feedback: demo_retry_share in [0, 1], got "
                             f"{demo_retry_share}")
        self.demo_retry_share = demo_retry_share
        self.numbers: list[int] = []
        self.target = 0

    def reset(self, example: Example) -> str:
        self.numbers, self.target = list(example.fields["numbers"]), int(example.fields["target"])
        return ""

    def feedback(self, expression: str) -> tuple[str, dict]:
        info = dict.fromkeys(("invalid", "wrong_numbers", "wrong_value", "solved"), False)
        try:
            value, used = parse(expression)
        except ExprError:
            info["invalid"] = True
            return "invalid\n", info
        if sorted(used) != sorted(self.numbers):
            info["wrong_numbers"] = True
            return "use " + " ".join(map(str, self.numbers)) + "\n", info
        if value != self.target:
            info["wrong_value"] = True
            return f"={_value(value)}\n", info
        info["solved"] = True
        return "", info

    def step(self, action: str) -> StepResult:
        obs, info = self.feedback(action.strip())
        return StepResult(obs, float(info["solved"]), info["solved"], info)

    def demo(self, example: Example, rng: random.Random) -> list[tuple[str, str]]:
        """The task's solution, after (with probability ``demo_retry_share``) one wrong try
        and its feedback, so the model sees how feedback is used."""
        self.reset(example)
        turns: list[tuple[str, str]] = []
        if rng.random() < self.demo_retry_share:
            for _ in range(10):
                wrong = random_expression(rng, list(self.numbers))
                obs, info = self.feedback(wrong)
                if info["wrong_value"]:
                    turns += [("policy", wrong + "\n"), ("env", obs)]
                    break
        return turns + [("policy", example.demo + "\n")]
