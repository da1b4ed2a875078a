"""GDRO (`reroll.methods.gdro`) bins prompts by their online pass@k, as the paper does; the
recent mean success rate stays available as ``bin_by = "mean_rate"``."""

import math

import pytest

from reroll.control.allocators import ALLOCATORS
from reroll.control.selectors import SELECTORS
from reroll.control.stats import PromptStats
from reroll.methods.gdro import pass_at_k
from reroll.rollout import Example

EXS = [Example(f"p{i}", f"{i}=", str(i)) for i in range(4)]


def test_pass_at_k_by_hand():
    """Unbiased pass@k, 1 - C(n - c, k) / C(n, k): 1 of 8 at k = 4 is 1 - C(7, 4) / C(8, 4)
    = 1 - 35 / 70 = 0.5; 0 of 8 is 0; with n < k the plug-in 1 - (1 - c/n)^k: 1 of 2 at
    k = 4 is 1 - 0.5^4 = 0.9375."""
    assert pass_at_k(1, 8, k=4) == 0.5
    assert pass_at_k(0, 8, k=4) == 0.0 and pass_at_k(8, 8, k=4) == 1.0
    assert pass_at_k(2, 8, k=1) == 0.25
    assert pass_at_k(1, 2, k=4) == 0.9375
    with pytest.raises(ValueError, match="successes"):
        pass_at_k(3, 2, k=1)


def test_prompt_gdro_bins_by_online_pass_at_k_by_default():
    """The paper's difficulty is online pass@k. A prompt with 1 success in 8 has mean rate
    0.125 (bin 0 of 4) but pass@4 = 0.5 (bin 2 of 4: [0.5, 0.75)); 0 of 8 stays in bin 0."""
    st = PromptStats()
    st.observe("p0", 1, 8, step=0)
    st.observe("p1", 0, 8, step=0)
    sel = SELECTORS.get("gdro")(EXS, 0, 2, bins=4)
    sel.end_step([("p0", 8, 1), ("p1", 8, 0)], st)
    assert sel.bin_of == {"p0": 2, "p1": 0}
    rate = SELECTORS.get("gdro")(EXS, 0, 2, bins=4, bin_by="mean_rate")
    rate.end_step([("p0", 8, 1), ("p1", 8, 0)], st)
    assert rate.bin_of == {"p0": 0, "p1": 0}


def test_rollout_gdro_pools_the_rate_over_pass_at_k_bins_by_default():
    """Rollout-GDRO pools the success rate over the prompt's pass@k bin: "a" (1 of 8,
    pass@4 0.5) and "b" (4 of 8, pass@4 = 1 - C(4, 4) / C(8, 4) = 69/70) fall in bins 2 and
    3 of 4, so "a" keeps its own 1/8 and sizes sqrt(1/8 * 7/8) / 0.05 = 6.61 -> 7. By mean
    rate both sit in bins 0 and 2 instead."""
    st = PromptStats()
    st.observe("a", 1, 8, step=0)
    st.observe("b", 4, 8, step=0)
    st.observe("c", 0, 8, step=0)
    a = ALLOCATORS.get("gdro")(8, n_min=2, n_max=16, mu=0.05, lr=0.0)
    a.end_step([("a", 8, 1), ("b", 8, 4), ("c", 8, 0)], st)
    assert a.bin_rate == [0.0, None, 0.125, 0.5]
    assert a.initial(st.get("a")) == round(math.sqrt(0.125 * 0.875) / 0.05) == 7
    m = ALLOCATORS.get("gdro")(8, n_min=2, n_max=16, mu=0.05, lr=0.0, bin_by="mean_rate")
    m.end_step([("a", 8, 1), ("b", 8, 4), ("c", 8, 0)], st)
    assert m.bin_rate == [pytest.approx(1 / 16), None, 0.5, None]  # a and c pooled in bin 0
