"""How an update's metrics combine across its passes: a declared reduction per key.

An update runs mini-batches (one optimiser step each) of micro-batches (one forward and
backward pass each). Every metric the objective reports per pass, and every metric of an
optimiser step, declares here how its values combine into the one number of the update
(`REDUCTIONS`); `UpdateMetrics` applies them. A key that declares nothing is an error
that names it, not a guess from its name. The counters the update itself needs (positions
forwarded, entropy sums) are typed fields of `PassCounts`, never metrics.

Owns the table and the arithmetic of combining. Must not know what a metric means, the
model or the optimiser.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Reduce(enum.Enum):
    """How one key's values combine over an update."""

    MAX = "max"
    """The largest value of any pass."""
    MIN = "min"
    """The smallest value of any pass."""
    MINIBATCH_MEAN = "minibatch mean"
    """Each value is a share of its mini-batch's total (a loss under global normalisers:
    a pass's shares add up to the mini-batch's), averaged over the mini-batches."""
    SAMPLE_MEAN = "sample mean"
    """Mean over the passes weighted by the samples each passed (per-token means of a pass:
    clip fractions, IS ratios, KL estimates)."""
    LAST = "last"
    """The last mini-batch's value (the last optimiser step's gradient norm)."""


@dataclass(frozen=True)
class Reduction:
    how: Reduce
    start: float | None = None
    """For MIN / MAX: the value the reduction starts from (None: the first value)."""


_SAMPLE_MEAN = Reduction(Reduce.SAMPLE_MEAN)
_MINIBATCH_MEAN = Reduction(Reduce.MINIBATCH_MEAN)

REDUCTIONS: dict[str, Reduction] = {
    # the objective's loss terms (`reroll.algo.Objective.loss`)
    "loss/policy": _MINIBATCH_MEAN,
    "loss/kl": _MINIBATCH_MEAN,
    "kl_ref": _SAMPLE_MEAN,
    "entropy_proxy": _SAMPLE_MEAN,
    # surrogates (`reroll.algo.surrogates`)
    "clip_frac_low": _SAMPLE_MEAN,
    "clip_frac_high": _SAMPLE_MEAN,
    "clip_frac_dual": _SAMPLE_MEAN,
    "ppo_kl": _SAMPLE_MEAN,
    "ratio_capped_frac": _SAMPLE_MEAN,
    # off-policy corrections (`reroll.algo.corrections`)
    "is/ratio_mean": _SAMPLE_MEAN,
    "is/ratio_max": Reduction(Reduce.MAX),
    "is/ratio_min": Reduction(Reduce.MIN),
    "is/weight_mean": _SAMPLE_MEAN,
    "is/ess": _SAMPLE_MEAN,
    "is/dropped_frac": _SAMPLE_MEAN,
    "is/kl_k1": _SAMPLE_MEAN,
    "is/kl_k3": _SAMPLE_MEAN,
    "is/prefix_mean": _SAMPLE_MEAN,  # MinPRO's mean prefix factor
    # each optimiser step: the clipped gradient's norm, VCPO's ESS-scaled learning rate
    "grad_norm": Reduction(Reduce.LAST),
    "vcpo/ess": _MINIBATCH_MEAN,
    "vcpo/ess_ratio": _MINIBATCH_MEAN,
    "vcpo/lr_scale": _MINIBATCH_MEAN,
    "vcpo/ess_ratio_min": Reduction(Reduce.MIN, start=1.0),
}


def declare(key: str, how: Reduce, start: float | None = None) -> None:
    """Declare how a metric of your own component (a surrogate, a correction, ...) combines
    across passes, e.g. ``declare("my/ratio_max", Reduce.MAX)``."""
    REDUCTIONS[key] = Reduction(how) if start is None else Reduction(how, start=start)


def reduction(key: str) -> Reduction:
    """The declared reduction of ``key``. An undeclared key (a user component's metric) is
    averaged over samples, with one warning naming it and how to declare it, rather than
    stopping a run after its generation."""
    try:
        return REDUCTIONS[key]
    except KeyError:
        import warnings

        warnings.warn(f"metric {key!r} declares no reduction across passes: averaged over "
                      f"samples; declare it with reroll.trainer.reductions.declare({key!r}, "
                      f"Reduce.MAX | MIN | MINIBATCH_MEAN | SAMPLE_MEAN | LAST)", UserWarning,
                      stacklevel=3)
        REDUCTIONS[key] = _SAMPLE_MEAN  # warned once
        return _SAMPLE_MEAN


class UpdateMetrics:
    """The update's metrics as passes report them, combined by `REDUCTIONS`.
    ``minibatches``: the update's mini-batches; ``samples``: the samples its passes run
    (the weights of SAMPLE_MEAN add up to 1 over the update)."""

    def __init__(self, minibatches: int, samples: int):
        self.minibatches, self.samples = minibatches, samples
        self.values: dict[str, float] = {}

    def add(self, key: str, value: float, samples: int = 0) -> None:
        """One pass's (or one optimiser step's) ``value`` of ``key``; ``samples``: the
        samples that pass ran (SAMPLE_MEAN's weight)."""
        r, old = reduction(key), self.values.get(key)
        if r.how is Reduce.MAX:
            new = max(_first(old, r, value), value)
        elif r.how is Reduce.MIN:
            new = min(_first(old, r, value), value)
        elif r.how is Reduce.MINIBATCH_MEAN:
            new = (0.0 if old is None else old) + value / self.minibatches
        elif r.how is Reduce.SAMPLE_MEAN:
            new = (0.0 if old is None else old) + value * samples / self.samples
        else:
            new = value
        self.values[key] = new

    def add_all(self, values: dict[str, float], samples: int = 0) -> None:
        for k, v in values.items():
            self.add(k, float(v), samples)


def _first(old: float | None, r: Reduction, value: float) -> float:
    if old is not None:
        return old
    return value if r.start is None else r.start


@dataclass
class PassCounts:
    """What the update's passes count for its own metrics (sums over every pass)."""

    positions: float = 0.0
    """Token positions the loss's passes forwarded (padding and packed rows included)."""
    real_tokens: float = 0.0
    """Real (non-padding) tokens of the samples those passes ran."""
    entropy_sum: float = 0.0
    """Policy entropy summed over the passed samples' trainable tokens."""
    entropy_tokens: float = 0.0
    """Trainable tokens of the passed samples."""

    def metrics(self) -> dict[str, float]:
        """The update's pass metrics: padding share, positions and mean entropy."""
        return {"train/padding_share": 1.0 - self.real_tokens / max(self.positions, 1.0),
                "train/positions": self.positions,
                "train/entropy": self.entropy_sum / max(self.entropy_tokens, 1.0)}
