"""Guess the number: the policy guesses a secret in [1, n], the environment answers
"higher" or "lower", and the episode ends when the guess is right (reward 1) or the turns
run out (reward 0). Each policy turn is a number followed by a newline (the stop string).

Step info: ``invalid`` (the turn is not a number in range), ``found``.
"""

from __future__ import annotations

import random

from reroll.envs.base import ENVIRONMENTS, StepResult
from reroll.rollout import Example


@ENVIRONMENTS.register("guess", ranges={"n": "[2, inf)"})
class Guess:
    stop_strings = ["\n"]

    def __init__(self, *, n: int = 16, demo_strategy: str = "random"):
        if n < 2 or demo_strategy not in ("random", "bisect"):
            raise ValueError(f"guess: n >= 2 and demo_strategy random|bisect, got {n}, "
                             f"{demo_strategy!r}")
        self.n, self.demo_strategy = n, demo_strategy
        self.secret = 0

    def reset(self, example: Example) -> str:
        self.secret = int(example.fields["secret"])
        return ""

    def step(self, action: str) -> StepResult:
        text = action.strip()
        if not text.isdigit() or not 1 <= int(text) <= self.n:
            return StepResult("invalid\n", 0.0, False, {"invalid": True, "found": False})
        g = int(text)
        if g == self.secret:
            return StepResult("", 1.0, True, {"invalid": False, "found": True})
        return StepResult("higher\n" if g < self.secret else "lower\n", 0.0, False,
                          {"invalid": False, "found": False})

    def demo(self, example: Example, rng: random.Random) -> list[tuple[str, str]]:
        """Guesses inside the interval still possible: its middle ("bisect"), or a random
        point of it ("random", a valid but slow strategy RL can improve on)."""
        secret, lo, hi, turns = int(example.fields["secret"]), 1, self.n, []
        while True:
            g = (lo + hi) // 2 if self.demo_strategy == "bisect" else rng.randint(lo, hi)
            turns.append(("policy", f"{g}\n"))
            if g == secret:
                return turns
            if g < secret:
                lo = g + 1
                turns.append(("env", "higher\n"))
            else:
                hi = g - 1
                turns.append(("env", "lower\n"))
