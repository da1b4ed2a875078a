"""Rollout-control rules shared by several methods (pure): argument checks written as the
registry's ranges, rounding, integer allocation under a total and the shadow price's dual
step.

Each paper's own arithmetic lives with its registrations in `reroll.methods` (AR3PO, DARS,
XRPO, GDRO, VADE, DOTS, DUET, SIRI, DOT). Randomness is the caller's: draws come in as arguments, so
every rule is deterministic. Must not know about rollouts, prompts, torch, registries' entries
or any state kept between steps (the caller holds posteriors, weights, prices and EMAs and
passes them back in).
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable

import numpy as np

from reroll.registry import Choice, Range, check_range, parse_range


def fail(fn: str, name: str, rule: str, value: object) -> ValueError:
    return ValueError(f"{fn}: {name} must be {rule}, got {value!r}")


def ranged(**ranges: str) -> Callable[[Callable], Callable]:
    """Checks a rule's named arguments against intervals written as a registry's ``ranges=``
    (`reroll.registry.Range`, `Choice`) before each call: a ValueError ``"fn: name must be
    in [1, inf), got 0"``. An argument annotated ``int`` must also be an int; one annotated
    as optional may be None."""
    parsed: dict[str, Range | Choice] = {k: parse_range(v) for k, v in ranges.items()}

    def deco(fn: Callable) -> Callable:
        sig = inspect.signature(fn)
        ann = {k: str(p.annotation) for k, p in sig.parameters.items()}
        unknown = set(parsed) - set(ann)
        if unknown:
            raise TypeError(f"{fn.__name__} has no argument(s) {sorted(unknown)}")

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            for k, rng in parsed.items():
                v = bound.arguments[k]
                v = v.item() if isinstance(v, np.generic) else v
                if v is None and "None" in ann[k]:
                    continue
                if ann[k] in ("int", "<class 'int'>") and (isinstance(v, bool)
                                                           or not isinstance(v, int)):
                    raise fail(fn.__name__, k, f"an int in {rng.text}", v)
                err = check_range(f"{fn.__name__}: {k}", v, rng)
                if err:
                    raise ValueError(err)
            return fn(*args, **kwargs)

        return checked

    return deco


def reals(fn: str, name: str, values: object, lo: float = -math.inf, hi: float = math.inf,
          nonempty: bool = True) -> list[float]:
    """``values`` as floats, each finite and in [lo, hi] (a list argument: not a range)."""
    try:
        out = [float(v) for v in values]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise fail(fn, name, "a list of numbers", values) from None
    if nonempty and not out:
        raise fail(fn, name, "non-empty", values)
    if not all(math.isfinite(v) and lo <= v <= hi for v in out):
        rule = ("" if lo == -math.inf else f" >= {lo:g}") if hi == math.inf else (
            f" <= {hi:g}" if lo == -math.inf else f" in [{lo:g}, {hi:g}]")
        raise fail(fn, name, f"finite numbers{rule}", values)
    return out


def bounds(fn: str, n_min: int, n_max: int) -> tuple[int, int]:
    """(n_min, n_max), refused when n_max < n_min (their ranges are the caller's)."""
    if n_max < n_min:
        raise fail(fn, "n_max", f">= n_min ({n_min})", n_max)
    return int(n_min), int(n_max)


def round_half_up(x: float) -> int:
    """Nearest int, halves up; rounding to 9 decimals first absorbs float noise (2.4999999999)."""
    return math.floor(round(x, 9) + 0.5)


# --- integer allocation under a total (GDRO's group sizes, DUET's batch rule) -------------


def _fill_level(w: list[float], need: float, lo: int, hi: int) -> float:
    """The scale c with sum_i clip(c w_i, lo, hi) == need (all w_i > 0, lo*len <= need <=
    hi*len): the sum is piecewise linear in c, so walk its breakpoints and interpolate."""
    cuts = sorted({0.0, *(lo / x for x in w), *(hi / x for x in w)})
    total = [sum(min(max(c * x, lo), hi) for x in w) for c in cuts]
    if total[0] >= need:  # the sum is flat (all at lo) up to the first breakpoint
        return 0.0
    for j in range(1, len(cuts)):
        if total[j] >= need:
            return cuts[j - 1] + (need - total[j - 1]) * (cuts[j] - cuts[j - 1]) / (
                total[j] - total[j - 1])
    return cuts[-1]


def allocate(w: list[float], target: int, lo: int, hi: int) -> list[int]:
    """Integers n_i in [lo, hi] summing to ``target`` (lo*len <= target <= hi*len), with
    n_i proportional to w_i >= 0 where the bounds allow (water-filling), rounded by largest
    remainder, ties to the lower index. Zero-weight entries stay at ``lo`` unless every
    positive entry is at ``hi`` and the total still needs more; then they share the rest
    evenly (all weights zero -> an even spread)."""
    pos = [i for i, x in enumerate(w) if x > 0]
    zero = [i for i, x in enumerate(w) if x <= 0]
    x = [float(lo)] * len(w)
    need = target - lo * len(zero)
    if pos and need >= hi * len(pos):
        for i in pos:
            x[i] = float(hi)
        for i in zero:
            x[i] = lo + (need - hi * len(pos)) / len(zero)
    elif pos:
        c = _fill_level([w[i] for i in pos], need, lo, hi)
        for i in pos:
            x[i] = min(max(c * w[i], lo), hi)
    elif zero:
        x = [target / len(w)] * len(w)
    out = [math.floor(round(v, 9)) for v in x]
    frac = [v - o for v, o in zip(x, out)]
    order = sorted((i for i in range(len(w)) if out[i] < hi), key=lambda i: (-frac[i], i))
    for i in order[: target - sum(out)]:
        out[i] += 1
    return out


@ranged(mu="[0, inf)", lr="[0, inf)", realized_mean="(-inf, inf)", budget="(-inf, inf)")
def dual_step(mu: float, realized_mean: float, budget: float, *, lr: float) -> float:
    """A shadow price by projected dual ascent (Rollout-GDRO's, also XRPO's and DUET's):
    mu' = max(0, mu + lr * (realized_mean - budget)). Spending above budget raises the price."""
    return max(0.0, float(mu) + float(lr) * (float(realized_mean) - float(budget)))
