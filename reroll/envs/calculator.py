"""The calculator tool: arithmetic the policy cannot do reliably alone (three-digit
multiplication for a tiny model), reachable through a tool call.

Tool-call format (reroll's documented tag format): the policy writes
``<calc>EXPRESSION</calc>``; the turn ends at the closing tag (a stop string), and the
environment answers ``<res>VALUE</res>`` (``<res>error</res>`` for an expression it cannot
evaluate: only digits, ``+ - * /`` and brackets, parsed by `reroll.tasks.expr`, never eval).
A turn without a tool call is the final answer: reward 1 if it equals the example's answer,
else 0; the episode ends. More than ``max_calls`` calls end the episode with reward 0.

Step info, summed per episode by the metrics: ``tool_call`` (a call was made),
``tool_ok`` (the call was well formed and computed the problem's own expression),
``answered``, ``correct``, ``used_result`` (the final answer repeats the tool's last result).
"""

from __future__ import annotations

import random

from reroll.envs.base import ENVIRONMENTS, StepResult
from reroll.rollout import Example
from reroll.tasks.expr import ExprError, evaluate

OPEN, CLOSE = "<calc>", "</calc>"


def format_value(text: str) -> str:
    """The value of ``text`` as the tool prints it: an integer, or a reduced fraction."""
    v = evaluate(text)
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


def parse_call(action: str) -> str | None:
    """The expression of a tool call ending the turn, or None when the turn is an answer."""
    if not action.endswith(CLOSE) or OPEN not in action:
        return None
    return action[action.rindex(OPEN) + len(OPEN): -len(CLOSE)]


@ENVIRONMENTS.register("calculator", ranges={"max_calls": "[0, inf)",
                                                  "demo_tool_share": "[0, 1]"})
class Calculator:
    stop_strings = [CLOSE]

    def __init__(self, *, max_calls: int = 2, demo_tool_share: float = 0.5):
        if max_calls < 0 or not 0.0 <= demo_tool_share <= 1.0:
            raise ValueError(f"calculator: max_calls >= 0 and demo_tool_share in [0, 1], got "
                             f"{max_calls}, {demo_tool_share}")
        self.max_calls, self.demo_tool_share = max_calls, demo_tool_share
        self.example: Example | None = None
        self.calls, self.last = 0, None

    def reset(self, example: Example) -> str:
        self.example, self.calls, self.last = example, 0, None
        return ""

    def step(self, action: str) -> StepResult:
        expr = parse_call(action)
        if expr is None:  # the final answer
            answer = action.strip()
            correct = answer == self.example.answer
            return StepResult("", float(correct), True,
                              {"tool_call": False, "answered": True, "correct": correct,
                               "used_result": self.last is not None and answer == self.last})
        self.calls += 1
        try:
            value = format_value(expr)
        except ExprError:
            value = "error"
        problem = self.example.prompt.rstrip("=").replace(" ", "")
        ok = value != "error" and expr.replace(" ", "") == problem
        self.last = value
        info = {"tool_call": True, "tool_ok": ok, "answered": False}
        if self.calls > self.max_calls:
            return StepResult("", 0.0, True, info)
        return StepResult(f"<res>{value}</res>", 0.0, False, info)

    def demo(self, example: Example, rng: random.Random) -> list[tuple[str, str]]:
        """A demonstration: with probability ``demo_tool_share`` one tool call then the
        answer, else the answer alone (so SFT leaves RL room to learn when to call)."""
        answer = example.answer
        if rng.random() < self.demo_tool_share:
            expr = example.prompt.rstrip("=")
            return [("policy", f"{OPEN}{expr}{CLOSE}"), ("env", f"<res>{answer}</res>"),
                    ("policy", answer)]
        return [("policy", answer)]
