"""Rollout-control rules (pure): the arithmetic behind staged sampling, budget allocation,
posterior updates, prompt-selection weights, length schedules and abort gates.

Owns plain functions of numbers -> numbers for AR3PO (3.3), DUET (3.4), VADE (3.5), XRPO
(3.6), DARS (3.7), DOTS (3.9), SIRI (3.10), DOT (3.11) and GDRO (3.14) of ALGORITHMS.md.
Randomness is the caller's: draws (DUET's ``u``, VADE's Thompson sample) come in as
arguments, so every rule is deterministic. Registered components wrap these. Must not know
about rollouts, prompts, torch, registries or any state kept between steps (the caller holds
posteriors, weights, prices and EMAs and passes them back in).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np


def _fail(fn: str, name: str, rule: str, value: object) -> ValueError:
    return ValueError(f"{fn}: {name} must be {rule}, got {value!r}")


def _int(fn: str, name: str, value: object, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise _fail(fn, name, f"an int >= {lo}", value)
    return int(value)


def _range(lo: float, hi: float) -> str:
    if hi == math.inf:
        return "" if lo == -math.inf else f" >= {lo:g}"
    return f" <= {hi:g}" if lo == -math.inf else f" in [{lo:g}, {hi:g}]"


def _real(fn: str, name: str, value: object, lo: float = -math.inf, hi: float = math.inf,
          rule: str | None = None) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not (lo <= value <= hi) or not math.isfinite(value):
        raise _fail(fn, name, rule or f"a finite number{_range(lo, hi)}", value)
    return float(value)


def _positive(fn: str, name: str, value: object, hi: float = math.inf) -> float:
    rule = "a finite number > 0" if hi == math.inf else f"in (0, {hi:g}]"
    x = _real(fn, name, value, 0.0, hi, rule=rule)
    if x <= 0:
        raise _fail(fn, name, rule, value)
    return x


def _reals(fn: str, name: str, values: object, lo: float = -math.inf, hi: float = math.inf,
           nonempty: bool = True) -> list[float]:
    try:
        out = [float(v) for v in values]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise _fail(fn, name, "a list of numbers", values) from None
    if nonempty and not out:
        raise _fail(fn, name, "non-empty", values)
    if not all(math.isfinite(v) and lo <= v <= hi for v in out):
        raise _fail(fn, name, f"finite numbers{_range(lo, hi)}", values)
    return out


def _round_half_up(x: float) -> int:
    """Nearest int, halves up; rounding to 9 decimals first absorbs float noise (2.4999999999)."""
    return math.floor(round(x, 9) + 0.5)


# --- AR3PO (3.3) -------------------------------------------------------------------------


def ar3po_more(n_correct: int, n_so_far: int, stage: int, *, k: int, max_stages: int) -> int:
    """AR3PO staged sampling (ALGORITHMS 3.3): how many responses to add after ``stage``.

    Stage 0 is the initial ``k`` samples. A prompt stays active (gets ``k`` more) while it has
    no correct response and the stage cap is not reached: ``k if n_correct == 0 and stage + 1 <
    max_stages else 0``. ``stage >= max_stages`` is an error (that stage should never have run).
    """
    f = "ar3po_more"
    k, max_stages = _int(f, "k", k, 1), _int(f, "max_stages", max_stages, 1)
    n_so_far = _int(f, "n_so_far", n_so_far, 0)
    n_correct, stage = _int(f, "n_correct", n_correct, 0), _int(f, "stage", stage, 0)
    if n_correct > n_so_far:
        raise _fail(f, "n_correct", f"<= n_so_far ({n_so_far})", n_correct)
    if stage >= max_stages:
        raise _fail(f, "stage", f"< max_stages ({max_stages})", stage)
    return k if n_correct == 0 and stage + 1 < max_stages else 0


# --- DARS (3.7) --------------------------------------------------------------------------


def dars_extra(acc: float, n: int, *, n_max: int, schedule: str = "et",
               std_norm: bool = False) -> int:
    """DARS round-2 extra samples Δn for a prompt with round-1 accuracy ``acc`` over ``n``
    samples (ALGORITHMS 3.7). Zero unless ``acc < 0.5``; ``a = 0.5/n`` when ``acc == 0``.

    S(a) = 2a(1-a), A_peak = n/2        (std_norm=False: total |advantage| of a group is n S)
    S(a) = 2 sqrt(a(1-a)), A_peak = n   (std_norm=True)
    ET: Δn = ceil((A_peak - n S) / S);  HW: Δn = ceil((2(1-a) A_peak - n S) / S)
    then clipped to [0, n_max - n]. The quotient is rounded to 9 decimals before ``ceil`` so
    that an exact integer computed as 30.000000000000007 gives 30, not 31.
    """
    f = "dars_extra"
    acc, n = _real(f, "acc", acc, 0.0, 1.0), _int(f, "n", n, 1)
    n_max = _int(f, "n_max", n_max, 1)
    if n_max < n:
        raise _fail(f, "n_max", f">= n ({n})", n_max)
    if schedule not in ("et", "hw"):
        raise _fail(f, "schedule", "'et' or 'hw'", schedule)
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


# --- XRPO (3.6) --------------------------------------------------------------------------


@lru_cache(maxsize=4096)
def _t_quantile(q: float, df: int) -> float:
    from scipy.stats import t  # lazy: scipy costs ~0.3 s to import and only XRPO needs it

    return float(t.ppf(q, df))


def _alpha(f: str, alpha: float) -> float:
    if _positive(f, "alpha", alpha, 1.0) == 1.0:
        raise _fail(f, "alpha", "in (0, 1)", alpha)
    return float(alpha)


def t_halfwidth(std: float, n: int, *, alpha: float = 0.05) -> float:
    """XRPO confidence half-width (ALGORITHMS 3.6): h(n) = t_{1-alpha/2, n-1} * std / sqrt(n);
    ``inf`` for n < 2 (no degrees of freedom: the mean is not yet bounded at all)."""
    f = "t_halfwidth"
    std, n, alpha = _real(f, "std", std, 0.0), _int(f, "n", n, 0), _alpha(f, alpha)
    if n < 2:
        return math.inf
    return _t_quantile(1.0 - alpha / 2.0, n - 1) * std / math.sqrt(n)


def xrpo_gain(values: list[float], *, alpha: float = 0.05, explore: float = 0.0,
              total: int = 0) -> float:
    """XRPO allocation priority of a prompt (ALGORITHMS 3.6): the expected shrinkage of its
    half-width from one more sample, h(n) - h(n+1) with the sample std s (ddof=1) of
    ``values``, plus a UCB bonus ``explore * sqrt(log(max(total, 2)) / n)`` (``total`` =
    samples drawn so far across prompts). ``inf`` for n < 2: such a prompt must be sampled.

    ``values`` are rewards in [0, 1] (correctness or a success fraction). When they are all
    equal (s = 0) the gain would be 0 and an all-wrong prompt would never be revisited, so s is
    replaced by a pseudo-std sqrt(p(1-p)) with the Beta(1,1)-smoothed success rate
    p = (sum(values) + 1) / (n + 2): e.g. four zeros give p = 1/6, s = sqrt(5)/6.
    """
    f = "xrpo_gain"
    vals = _reals(f, "values", values, 0.0, 1.0, nonempty=False)
    explore, total = _real(f, "explore", explore, 0.0), _int(f, "total", total, 0)
    alpha, n = _alpha(f, alpha), len(vals)
    if n < 2:
        return math.inf
    std = float(np.std(vals, ddof=1))
    if std == 0.0:
        p = (sum(vals) + 1.0) / (n + 2.0)
        std = math.sqrt(p * (1.0 - p))
    gain = t_halfwidth(std, n, alpha=alpha) - t_halfwidth(std, n + 1, alpha=alpha)
    return gain + explore * math.sqrt(math.log(max(total, 2)) / n)


# --- GDRO (3.14) and DUET (3.4): integer allocation under a total ------------------------


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


def _allocate(w: list[float], target: int, lo: int, hi: int) -> list[int]:
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


def _bounds(f: str, n_min: int, n_max: int) -> tuple[int, int]:
    n_min, n_max = _int(f, "n_min", n_min, 0), _int(f, "n_max", n_max, 1)
    if n_max < n_min:
        raise _fail(f, "n_max", f">= n_min ({n_min})", n_max)
    return n_min, n_max


def gdro_sizes(p: list[float], *, mean_budget: float, n_min: int, n_max: int) -> list[int]:
    """Rollout-GDRO group sizes (ALGORITHMS 3.14): n_i in [n_min, n_max] proportional to the
    Bernoulli std s_i = sqrt(p_i (1 - p_i)), with sum n_i == T = round(mean_budget * len(p))
    (halves up). Water-filling finds c with sum clip(c s_i, n_min, n_max) = T, then largest
    remainder (ties to the lower index) makes the counts integers. An infeasible T clips to
    n_min*len or n_max*len. Prompts with s_i = 0 (p in {0, 1}) get n_min unless the others
    are all at n_max; if every s_i == 0 the budget is spread evenly. Deterministic.
    """
    f = "gdro_sizes"
    probs = _reals(f, "p", p, 0.0, 1.0)
    mean_budget = _real(f, "mean_budget", mean_budget, 0.0)
    lo, hi = _bounds(f, n_min, n_max)
    m = len(probs)
    target = min(max(_round_half_up(mean_budget * m), lo * m), hi * m)
    return _allocate([math.sqrt(q * (1.0 - q)) for q in probs], target, lo, hi)


def duet_allocation(scores: list[float], *, token_budget: int, mean_len: float, n_min: int,
                    n_max: int) -> list[int]:
    """DUET pre-rollout allocation (ALGORITHMS 3.4): samples per prompt in [n_min, n_max]
    proportional to the informativeness score, with total T = floor(token_budget / mean_len)
    (the most samples whose expected tokens T * mean_len stay within the budget), clipped to
    [n_min*len, n_max*len] (so n_min each even over budget). Same water-filling and largest
    remainder as ``gdro_sizes``; zero-score prompts get n_min unless the rest are at n_max.
    """
    f = "duet_allocation"
    w = _reals(f, "scores", scores, 0.0)
    token_budget = _int(f, "token_budget", token_budget, 0)
    mean_len = _positive(f, "mean_len", mean_len)
    lo, hi = _bounds(f, n_min, n_max)
    m = len(w)
    target = min(max(math.floor(round(token_budget / mean_len, 9)), lo * m), hi * m)
    return _allocate(w, target, lo, hi)


def dual_step(mu: float, realized_mean: float, budget: float, *, lr: float) -> float:
    """Rollout-GDRO shadow price (ALGORITHMS 3.14), projected dual ascent:
    mu' = max(0, mu + lr * (realized_mean - budget)). Spending above budget raises the price."""
    f = "dual_step"
    mu, lr = _real(f, "mu", mu, 0.0), _real(f, "lr", lr, 0.0)
    gap = _real(f, "realized_mean", realized_mean) - _real(f, "budget", budget)
    return max(0.0, mu + lr * gap)


def mw_update(weights: list[float], scores: list[float], *, eta: float,
              floor: float = 0.0) -> list[float]:
    """Prompt-GDRO multiplicative weights over bins (ALGORITHMS 3.14): w_b exp(eta score_b),
    normalised, then mixed with uniform: (1 - floor) w + floor / B. Computed in log space
    shifted by the largest log w_b + eta score_b, so large eta*score cannot overflow. A bin
    with weight 0 stays at 0 before the mix. ``weights`` need not be normalised."""
    f = "mw_update"
    w = _reals(f, "weights", weights, 0.0)
    s = _reals(f, "scores", scores)
    if len(s) != len(w):
        raise _fail(f, "scores", f"as long as weights ({len(w)})", scores)
    if sum(w) <= 0:
        raise _fail(f, "weights", "not all zero", weights)
    eta, floor = _real(f, "eta", eta, 0.0), _real(f, "floor", floor, 0.0, 1.0)
    logits = [math.log(x) + eta * y if x > 0 else -math.inf for x, y in zip(w, s)]
    top = max(logits)
    e = [math.exp(v - top) for v in logits]
    z = sum(e)
    return [(1.0 - floor) * v / z + floor / len(w) for v in e]


def ema(prev: float | None, x: float, *, rate: float) -> float:
    """Exponential moving average (GDRO bin scores, ALGORITHMS 3.14):
    x if prev is None else (1 - rate) prev + rate x."""
    x, rate = _real("ema", "x", x), _real("ema", "rate", rate, 0.0, 1.0)
    if prev is None:
        return x
    return (1.0 - rate) * _real("ema", "prev", prev) + rate * x


# --- VADE (3.5) --------------------------------------------------------------------------


def beta_update(alpha: float, beta: float, successes: float, failures: float, *,
                decay: float = 1.0, prior: tuple[float, float] = (1.0, 1.0)
                ) -> tuple[float, float]:
    """VADE posterior update with prior decay (ALGORITHMS 3.5):
    alpha' = a0 + decay (alpha - a0) + successes, beta' = b0 + decay (beta - b0) + failures,
    with (a0, b0) = ``prior``. decay = 1 is the plain conjugate update; decay = 0 forgets all
    earlier evidence. Decay pulls toward the prior, not toward zero, so a posterior never
    loses its pseudo-counts."""
    f = "beta_update"
    if not isinstance(prior, (tuple, list)) or len(prior) != 2:
        raise _fail(f, "prior", "a pair (a0, b0)", prior)
    a0, b0 = _positive(f, "prior[0]", prior[0]), _positive(f, "prior[1]", prior[1])
    alpha, beta = _positive(f, "alpha", alpha), _positive(f, "beta", beta)
    s, fl = _real(f, "successes", successes, 0.0), _real(f, "failures", failures, 0.0)
    decay = _real(f, "decay", decay, 0.0, 1.0)
    return a0 + decay * (alpha - a0) + s, b0 + decay * (beta - b0) + fl


def info_score(p: float) -> float:
    """VADE ranking score of a Thompson draw p (ALGORITHMS 3.5): the Bernoulli variance
    p (1 - p), largest (0.25) at p = 0.5 where GRPO advantages are most often non-zero."""
    p = _real("info_score", "p", p, 0.0, 1.0)
    return p * (1.0 - p)


# --- DOTS (3.9) --------------------------------------------------------------------------


def dots_weights(p_hat: list[float], *, alpha: float = 0.5, tau: float = 1e-3) -> list[float]:
    """DOTS selection probabilities (ALGORITHMS 3.9): softmax of -|p_hat_i - alpha| / tau,
    computed stably (the largest exponent is subtracted first, so tau = 1e-4 does not turn
    into 0/0). ``p_hat`` are predicted success rates; only finiteness is checked, so a
    calibrated prediction slightly outside [0, 1] is accepted."""
    f = "dots_weights"
    ps = _reals(f, "p_hat", p_hat)
    alpha, tau = _real(f, "alpha", alpha, 0.0, 1.0), _positive(f, "tau", tau)
    z = [-abs(p - alpha) / tau for p in ps]
    top = max(z)
    e = [math.exp(v - top) for v in z]
    total = sum(e)
    return [v / total for v in e]


# --- SIRI (3.10) and DOT (3.11) ----------------------------------------------------------


def siri_max_len(step: int, *, low: int, high: int, period: int,
                 start: str = "compress") -> int:
    """SIRI cosine length cap (ALGORITHMS 3.10), one cycle low -> high -> low per ``period``:
    L = low + (high - low) (1 - cos(2 pi step / period)) / 2, rounded half up. ``start =
    "expand"`` shifts by half a period (cos -> -cos), so step 0 gives ``high``."""
    f = "siri_max_len"
    step, period = _int(f, "step", step, 0), _int(f, "period", period, 2)
    low, high = _int(f, "low", low, 1), _int(f, "high", high, 1)
    if high < low:
        raise _fail(f, "high", f">= low ({low})", high)
    if start not in ("compress", "expand"):
        raise _fail(f, "start", "'compress' or 'expand'", start)
    c = math.cos(2.0 * math.pi * (step % period) / period)
    phase = (1.0 - c) / 2.0 if start == "compress" else (1.0 + c) / 2.0
    return _round_half_up(low + (high - low) * phase)


def dot_threshold(lengths: list[int], *, k: float = 2.0, quantile: float | None = None
                  ) -> float:
    """DOT outlier threshold of response lengths in an all-correct group (ALGORITHMS 3.11):
    mean + k * std (population std, ddof=0), or, when ``quantile`` is set, that quantile with
    numpy's 'linear' interpolation (``k`` is then ignored). Lengths strictly above are
    outliers, so a group of equal lengths (or a single response) has none."""
    f = "dot_threshold"
    ls = _reals(f, "lengths", lengths, 0.0)
    k = _real(f, "k", k, 0.0)
    if quantile is not None:
        q = _real(f, "quantile", quantile, 0.0, 1.0)
        return float(np.quantile(ls, q, method="linear"))
    return float(np.mean(ls) + k * np.std(ls))


# --- DUET (3.4) --------------------------------------------------------------------------


def duet_keep(u: float, *, q: float) -> tuple[bool, float]:
    """DUET marker-gated abort (ALGORITHMS 3.4) for a rollout with no answer marker past the
    horizon: with u ~ U(0, 1) drawn by the caller, continue with importance weight 1/q if
    u < q (probability q), else abort with weight 0: E[weight] = 1, so the estimator stays
    unbiased. u == q aborts."""
    u, q = _real("duet_keep", "u", u, 0.0, 1.0), _positive("duet_keep", "q", q, 1.0)
    return (True, 1.0 / q) if u < q else (False, 0.0)


def duet_informativeness(successes: int, trials: int, *, prior: float = 1.0) -> float:
    """DUET's pre-rollout informativeness of a prompt (ALGORITHMS 3.4): p (1 - p) at the mean
    of its Beta(prior + s, prior + n - s) posterior, p = (prior + s) / (2 prior + n), the
    Bernoulli variance that gives a GRPO group non-zero advantages. Unseen (n = 0): 0.25."""
    f = "duet_informativeness"
    n = _int(f, "trials", trials, 0)
    s = _int(f, "successes", successes, 0)
    if s > n:
        raise _fail(f, "successes", f"<= trials ({n})", successes)
    a = _positive(f, "prior", prior)
    p = (a + s) / (2.0 * a + n)
    return p * (1.0 - p)


def duet_size(score: float, rel_len: float, *, mu: float, n_min: int, n_max: int) -> int:
    """DUET samples for one prompt under a shadow price ``mu`` on tokens: the n that
    maximises ``score * log(n) - mu * n * rel_len`` (diminishing returns in samples, each
    costing its expected length ``rel_len`` in units of the pooled mean length) is
    ``score / (mu * rel_len)``, rounded half up and clipped to [n_min, n_max]; mu = 0 gives
    n_max. With one price for every group the sizes are proportional to score / length,
    as in ``duet_allocation``'s batch rule."""
    f = "duet_size"
    score, rel_len = _real(f, "score", score, 0.0), _positive(f, "rel_len", rel_len)
    mu = _real(f, "mu", mu, 0.0)
    lo, hi = _bounds(f, n_min, n_max)
    x = score / (mu * rel_len) if mu > 0.0 else math.inf
    return hi if x >= hi else max(lo, math.floor(x + 0.5))
