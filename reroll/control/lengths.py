"""Length schedules: the response limit in force for the groups started at a policy version.
``fixed`` is here; the scheduled ones are methods (`reroll.methods`: SIRI's cosine between a
compression and an expansion limit, `reroll.methods.siri`; docs/algorithms.md).

Owns the ``LENGTHS`` registry; an entry is built as ``cls(max_new_tokens, *,
hyperparameters)`` (``rollout.max_new_tokens``, the most any schedule may give, since the
engine sizes its cache for it) and called as ``schedule(version) -> int``. The limit a sample
was generated under is recorded in its sampling parameters, where length shaping reads it.
Pure; knows nothing of any method.
"""

from __future__ import annotations

from reroll.registry import METHODS, Registry

LENGTHS = Registry("length schedule", plugins=METHODS)


class Fixed:
    """``rollout.max_new_tokens`` at every version."""

    def __init__(self, max_new_tokens: int, /):
        self.max_new_tokens = max_new_tokens

    def __call__(self, version: int) -> int:
        return self.max_new_tokens


LENGTHS.register("fixed")(Fixed)
