"""DARS: difficulty-adaptive rollout sampling (Yang et al. 2025, "Depth-Breadth Synergy in
RLVR"). Rule in one line: after a first round of ``n`` samples, a prompt with accuracy below
0.5 gets a second round sized so that its total |advantage| reaches what a prompt at
accuracy 0.5 has, by the equal-treatment ("et") schedule or the hardness-weighted ("hw") one
that gives harder prompts more; after that round, groups that are all correct or all wrong
are dropped.

The method as its authors run it is ``preset = "dars"`` (configs/presets/dars.toml): this
allocator with its defaults, advantages without std normalisation (``algo.advantage_args =
{norm_by_std = false}``: the schedule below assumes them, so at accuracy 0 and n = 8 the
equal-treatment round adds 27 samples, 24 under the default cap of 32) and the
zero-variance filter (``algo.dynamic_sampling = true``) for the drop. The authors publish
their training scripts and code; we do not name a file or function of it we could not
check, and this module is our own code.

Where reroll differs:
- the second round is a round of the same group (the allocator's ``more``), capped at
  ``n_max`` samples in all;
- dropped groups are replaced by freshly sampled ones (reroll's dynamic sampling keeps
  the batch size), where the authors train on a smaller batch;
- ``std_norm = True`` is reroll's variant for std-normalised advantages
  (S(a) = 2 sqrt(a (1 - a)), A_peak = n), not the authors' setting.

Owns the rule (`dars_extra`) and the ``dars`` allocator.
"""

from __future__ import annotations

import math

from reroll.control.allocators import ALLOCATORS, Allocator
from reroll.control.rules import fail, ranged


@ranged(acc="[0, 1]", n="[1, inf)", n_max="[1, inf)", schedule="{et, hw}")
def dars_extra(acc: float, n: int, *, n_max: int, schedule: str = "et",
               std_norm: bool = False) -> int:
    """Round-2 extra samples Δn for a prompt with round-1 accuracy ``acc`` over ``n``
    samples. Zero unless ``acc < 0.5``; ``a = 0.5/n`` when ``acc == 0``.

    S(a) = 2a(1-a), A_peak = n/2        (std_norm=False: total |advantage| of a group is n S)
    S(a) = 2 sqrt(a(1-a)), A_peak = n   (std_norm=True)
    ET: Δn = ceil((A_peak - n S) / S);  HW: Δn = ceil((2(1-a) A_peak - n S) / S)
    then clipped to [0, n_max - n]. The quotient is rounded to 9 decimals before ``ceil`` so
    that an exact integer computed as 30.000000000000007 gives 30, not 31.
    """
    if n_max < n:
        raise fail("dars_extra", "n_max", f">= n ({n})", n_max)
    acc = float(acc)
    if acc >= 0.5:
        return 0
    a = 0.5 / n if acc == 0 else acc
    if std_norm:
        s, peak = 2.0 * math.sqrt(a * (1.0 - a)), float(n)
    else:
        s, peak = 2.0 * a * (1.0 - a), n / 2.0
    target = peak if schedule == "et" else 2.0 * (1.0 - a) * peak
    extra = math.ceil(round((target - n * s) / s, 9))
    return min(max(extra, 0), n_max - n)


@ALLOCATORS.register("dars", ranges={"n_max": "[1, inf)", "schedule": "{et, hw}"})
class DARS(Allocator):
    """DARS: ``group_size`` samples, then one more round for prompts with accuracy below
    0.5, sized by the equal-treatment ("et") or hardness-weighted ("hw") schedule, up to
    ``n_max`` samples in all. The schedule assumes advantages without std normalisation, as
    the authors run it (``preset = "dars"`` adds that and the drop of uniform groups);
    ``std_norm = true`` is reroll's variant for std-normalised advantages."""

    def __init__(self, group_size: int, /, *, n_max: int = 32, schedule: str = "et",
                 std_norm: bool = False):
        super().__init__(group_size)
        if schedule not in ("et", "hw"):
            raise ValueError(f"allocator 'dars': schedule must be 'et' or 'hw', got "
                             f"{schedule!r}")
        if n_max < group_size:
            raise ValueError(f"allocator 'dars': n_max ({n_max}) must be >= rollout."
                             f"group_size ({group_size})")
        self.n_max, self.schedule, self.std_norm = n_max, schedule, std_norm

    def more(self, prompt, values, successes, rounds):
        if rounds > 1:
            return 0
        n = len(values)
        return dars_extra(successes / n, n, n_max=self.n_max, schedule=self.schedule,
                          std_norm=self.std_norm)

    def max_size(self):
        return self.n_max
