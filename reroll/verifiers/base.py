"""The verifier contract and its registry.

Owns: the ``Verifier`` protocol, the ``VERIFIERS`` registry of factories, and the two ways a
verdict is written (``judged`` for a value with its reason, ``failed`` for an error).
Must not know: which verifiers exist (they register themselves), how rewards are combined,
or where scoring runs (process pool, thread).

The rule every verifier follows: a wrong, empty or malformed answer is a *value* (usually
0.0) with the reason in ``info``; an *error* means the verifier itself could not judge
(it raised, hung, died, or the reference data is broken). Errors are counted and never
silently turned into 0.0.

A registry entry is a factory whose keyword-only parameters are the hyperparameters, e.g.
``VERIFIERS.register("numeric")`` on ``def numeric(*, tolerance=1e-6) -> Verifier``.
``VERIFIERS.register(..., cheap=True)`` says a verifier is pure Python on the completion's
text, costs microseconds (linear in the text), runs no user code and does no I/O: it is
safe to call inline, in the rollout loop, with no timeout and no process around it
(``reward.inline = "auto"``). math-verify (sympy can hang), regexes given by the user,
user functions and code execution are not cheap.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from reroll.registry import Registry
from reroll.rollout import Example, Rollout, Score

VERIFIERS = Registry("verifier")


@runtime_checkable
class Verifier(Protocol):
    """Judges one finished rollout against its example.

    ``rollout.completion`` is the text to judge; ``example.answer`` and ``example.fields``
    are the reference. Returns a Score named ``name`` holding exactly one of value or error,
    with ``info["reason"]`` saying why (and ``info["parsed"]`` the extracted answer where
    there is one). May raise: the caller turns an exception into an error Score.
    """

    name: str

    def __call__(self, rollout: Rollout, example: Example) -> Score: ...


def judged(name: str, value: float, reason: str, **info: Any) -> Score:
    """A verdict: ``value`` with the reason (a wrong answer is a verdict, not an error)."""
    return Score(name=name, value=float(value), info={"reason": reason, **info})


def failed(name: str, error: str, **info: Any) -> Score:
    """The verifier could not judge (its own failure, or broken reference data)."""
    return Score(name=name, error=error, info={"reason": error, **info})


def need_field(name: str, example: Example, key: str) -> Any:
    """``example.fields[key]``, or a clear error naming the verifier, example and key."""
    if key not in example.fields:
        raise KeyError(
            f"verifier {name!r}: example {example.prompt_id!r} has no fields[{key!r}] "
            f"(fields present: {sorted(example.fields) or 'none'})"
        )
    return example.fields[key]
