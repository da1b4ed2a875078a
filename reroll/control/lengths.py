"""Length schedules: the response limit in force for the groups started at a policy version
(SIRI's schedule; docs/algorithms.md). Owns the ``LENGTHS`` registry; an entry is built as ``cls(max_new_tokens,
*, hyperparameters)`` (``rollout.max_new_tokens``, the most any schedule may give, since the
engine sizes its cache for it) and called as ``schedule(version) -> int``. The limit a sample
was generated under is recorded in its sampling parameters, where length shaping reads it.
Pure; the schedule math is in `rules`.
"""

from __future__ import annotations

from reroll.control import rules
from reroll.registry import Registry

LENGTHS = Registry("length schedule")


class Fixed:
    """``rollout.max_new_tokens`` at every version."""

    def __init__(self, max_new_tokens: int, /):
        self.max_new_tokens = max_new_tokens

    def __call__(self, version: int) -> int:
        return self.max_new_tokens


LENGTHS.register("fixed")(Fixed)


@LENGTHS.register("siri", ranges={"low": "[0, inf)", "period": "[2, inf)"})
class SIRI(Fixed):
    """SIRI: the limit follows a cosine between ``low`` (compression: dense reasoning, a
    truncated answer earns nothing) and ``rollout.max_new_tokens`` (expansion: room to
    explore), one full cycle every ``period`` versions, starting with compression
    (``start = "compress"``: the limit is ``low`` at version 0) or expansion. ``low = 0``:
    half of ``rollout.max_new_tokens``."""

    def __init__(self, max_new_tokens: int, /, *, low: int = 0, period: int = 100,
                 start: str = "compress"):
        super().__init__(max_new_tokens)
        self.low = low or max(1, max_new_tokens // 2)
        if not 1 <= self.low <= max_new_tokens:
            raise ValueError(f"length schedule 'siri': low must be in [1, rollout."
                             f"max_new_tokens={max_new_tokens}], got {self.low}")
        if start not in ("compress", "expand"):
            raise ValueError(f"length schedule 'siri': start must be 'compress' or 'expand', "
                             f"got {start!r}")
        self.period, self.start = period, start

    def __call__(self, version: int) -> int:
        return rules.siri_max_len(version, low=self.low, high=self.max_new_tokens,
                                  period=self.period, start=self.start)
