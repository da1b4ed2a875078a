"""DAPO's soft overlong punishment against hand-computed values."""

import pytest
import torch

from reroll.algo import overlong_penalty


def test_overlong_penalty_ramps_linearly_over_the_buffer():
    # max_len 20, buffer 4 -> expected limit 16: lengths <= 16 free, 17..20 ramp, > 20 -> -factor
    out = overlong_penalty(torch.tensor([10, 16, 17, 18, 20, 25]), max_len=20, buffer=4, factor=0.5)
    # 17: -0.5 * 1/4 = -0.125 ; 18: -0.5 * 2/4 = -0.25 ; 20: -0.5 * 4/4 = -0.5 ; 25: -0.5
    assert torch.allclose(out, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5, -0.5]))


def test_zero_buffer_disables_and_bad_arguments_are_named():
    assert torch.equal(overlong_penalty(torch.tensor([5, 50]), max_len=8, buffer=0), torch.zeros(2))
    with pytest.raises(ValueError, match="buffer <= max_len"):
        overlong_penalty(torch.tensor([1]), max_len=4, buffer=5)
