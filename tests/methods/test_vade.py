"""VADE (`reroll.methods.vade`): the posterior decays toward its prior on two scales, per
step of age and per newer observation; one scale is ``update_decay = 1``."""

import pytest

from reroll.control.selectors import SELECTORS
from reroll.control.stats import PromptStats
from reroll.rollout import Example

EXS = [Example(f"p{i}", f"{i}=", str(i)) for i in range(4)]


def test_the_posterior_decays_on_two_scales():
    """Paper's rule (two-scale prior decay, as we read it): evidence is pulled toward the
    Beta(1, 1) prior by ``decay`` per step of age and by ``update_decay`` more when a newer
    observation of the prompt arrives. History: 3 of 4 at step 0, 1 of 4 at step 2; at step
    3 with decay 0.5, update_decay 0.5:
      step 0: (1, 1) + (3, 1) = (4, 2)
      step 2: factor 0.5^2 * 0.5 = 0.125: (1 + 0.125 * 3 + 1, 1 + 0.125 * 1 + 3)
              = (2.375, 4.125)
      step 3: factor 0.5: (1 + 0.5 * 1.375, 1 + 0.5 * 3.125) = (1.6875, 2.5625)."""
    st = PromptStats()
    st.observe("p0", 3, 4, step=0)
    st.observe("p0", 1, 4, step=2)
    sel = SELECTORS.get("vade")(EXS, 0, 2, decay=0.5, update_decay=0.5)
    assert sel.posterior(st.get("p0"), 3) == pytest.approx((1.6875, 2.5625))
    default = SELECTORS.get("vade")(EXS, 0, 2)
    assert (default.decay, default.update_decay) == (0.9, 0.8)  # both scales on by default
    with pytest.raises(KeyError, match="update_decay"):
        SELECTORS.check_kwargs("vade", {"update_decay": 0.0})
