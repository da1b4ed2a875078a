"""SIRI: scaling iterative reinforcement learning with interleaved compression. The response
limit alternates between compression (a short limit: reasoning gets dense, a truncated answer
earns nothing) and expansion (a long one: room to explore), so a model learns to reason both
shorter and better. Its rule here: a cosine between ``low`` and ``rollout.max_new_tokens``, one
full cycle every ``period`` policy versions. Where reroll differs: the limit is read per
policy version at the moment a group starts (an asynchronous run's group keeps the limit of
the version that started it), and it never exceeds ``rollout.max_new_tokens``, which the
engine sizes its cache for.

Owns the rule (`siri_max_len`) and the ``siri`` length schedule.
"""

from __future__ import annotations

import math

from reroll.control.lengths import LENGTHS, Fixed
from reroll.control.rules import fail, ranged, round_half_up


@ranged(step="[0, inf)", period="[2, inf)", low="[1, inf)", high="[1, inf)",
        start="{compress, expand}")
def siri_max_len(step: int, *, low: int, high: int, period: int,
                 start: str = "compress") -> int:
    """SIRI's cosine length cap, one cycle low -> high -> low per ``period``:
    L = low + (high - low) (1 - cos(2 pi step / period)) / 2, rounded half up. ``start =
    "expand"`` shifts by half a period (cos -> -cos), so step 0 gives ``high``."""
    if high < low:
        raise fail("siri_max_len", "high", f">= low ({low})", high)
    c = math.cos(2.0 * math.pi * (step % period) / period)
    phase = (1.0 - c) / 2.0 if start == "compress" else (1.0 + c) / 2.0
    return round_half_up(low + (high - low) * phase)


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
        return siri_max_len(version, low=self.low, high=self.max_new_tokens,
                            period=self.period, start=self.start)
