"""DARS (`reroll.methods.dars`) as its authors run it, by default: the schedule without std
normalisation, and ``preset = "dars"`` dropping groups that are all correct or all wrong."""

from reroll.build_rollout import build_filters
from reroll.config_checks import load_checked
from reroll.control.allocators import ALLOCATORS
from reroll.rollout import Example, SamplingParams, Score, new_group


def test_the_dars_allocator_defaults_to_the_schedule_without_std_normalisation():
    """Paper's rule (equal treatment, advantages A = R - mean, as the authors' scripts run):
    S(a) = 2 a (1 - a) is a group's mean |advantage| per sample and the peak n S(0.5) = n/2;
    at accuracy 0 the accuracy is taken as a = 0.5 / n. With n = 8: a = 1/16,
    S = 2 (1/16)(15/16) = 0.1171875, n S = 0.9375, so the round adds
    ceil((4 - 0.9375) / 0.1171875) = ceil(26.13) = 27 samples, capped at n_max - n =
    32 - 8 = 24. reroll's std-normalised variant (S = 2 sqrt(a (1 - a)) = 0.48412,
    peak n = 8) gives ceil((8 - 3.8730) / 0.48412) = 9 and stays available as std_norm."""
    dars = ALLOCATORS.get("dars")(8)
    assert dars.max_size() == 32
    assert dars.more(None, [0.0] * 8, 0, rounds=1) == 24
    assert ALLOCATORS.get("dars")(8, std_norm=True).more(None, [0.0] * 8, 0, rounds=1) == 9


def _group(correct: list[bool]):
    g = new_group(Example("p", "q", "1"), len(correct), [1, 2], SamplingParams(), 0)
    for i, c in enumerate(correct):
        r = g.rollouts[i]
        r.scores = [Score(value=float(c), name="correct")]
    return g


def test_the_dars_preset_is_the_authors_setting_and_drops_uniform_groups():
    """The authors' scripts: no std normalisation, the equal-treatment schedule, and after the
    second round groups that are all correct or all wrong are dropped (they carry no
    advantage). ``preset = "dars"`` composes exactly that."""
    cfg = load_checked(None, ["preset=dars"])
    assert cfg.control.allocator == "dars"
    assert cfg.control.allocator_args == {"n_max": 32, "schedule": "et", "std_norm": False}
    assert cfg.algo.advantage == "grpo" and cfg.algo.advantage_args == {"norm_by_std": False}
    (drop,) = build_filters(cfg, lambda scores: scores[0].value)
    assert drop(_group([True] * 4)) == "zero_variance"
    assert drop(_group([False] * 4)) == "zero_variance"
    assert drop(_group([True, False, False, False])) is None
