"""MinPRO and M2PO against hand-computed values (same rho table as test_corrections)."""

import torch
from test_corrections import BEHAV, MASK, PROX, close  # the same rho table

from reroll.algo import CORRECTIONS


def run(name, prox=PROX, behav=BEHAV, mask=MASK, **kw):
    return CORRECTIONS.bind(name, kw)(prox, behav, mask)


def test_minpro_weighs_each_token_by_its_truncated_ratio_times_the_earlier_minimum():
    w, mask, m = run("minpro")  # cap 2
    # row 0: t0: prefix none -> 1, min(0.5, 2) = 0.5        -> 0.5
    #        t1: min(1, 0.5) = 0.5, min(3, 2) = 2            -> 1.0
    #        t2: min(1, min(0.5, 3)) = 0.5, min(1, 2) = 1    -> 0.5
    # row 1: t0: prefix 1, min(2.5, 2) = 2 -> 2; masked tokens 0
    close(w, [[0.5, 1.0, 0.5], [2.0, 0.0, 0.0]])
    close(mask, MASK.tolist())  # MinPRO masks nothing
    close(m["is/dropped_frac"], 3 / 4)  # row0 t1 (both), row0 t2 (prefix), row1 t0 (cap)
    close(m["is/prefix_mean"], (1 + 0.5 + 0.5 + 1) / 4)
    close(m["is/weight_mean"], (0.5 + 1.0 + 0.5 + 2.0) / 4)
    assert not w.requires_grad


def test_minpro_leaves_tool_tokens_out_of_the_minimum_but_in_their_place():
    # rho = 0.9, 0.1 (a tool token: mask 0), 1.5, 1.0
    rho = torch.tensor([[0.9, 0.1, 1.5, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])
    behav = torch.full((1, 4), -1.0)
    w, kept, _ = run("minpro", prox=behav + rho.log(), behav=behav, mask=mask)
    # t0: 1 * 0.9 = 0.9 ; t1: tool -> 0 ; t2: min(1, 0.9) * 1.5 = 1.35 (0.1 not counted)
    # t3: min(1, min(0.9, 1.5)) * 1.0 = 0.9
    close(w, [[0.9, 0.0, 1.35, 0.9]])
    close(kept, mask.tolist())


def test_minpro_never_up_weights_by_the_prefix():
    rho = torch.tensor([[4.0, 4.0, 1.0]])  # prefix ratios above 1: factor min(1, 4) = 1
    behav = torch.zeros(1, 3)
    w, _, _ = run("minpro", prox=rho.log(), behav=behav, mask=torch.ones(1, 3), cap=10.0)
    close(w, [[4.0, 4.0, 1.0]])


def test_m2po_masks_the_largest_second_moments_until_the_mean_is_under_the_threshold():
    # (log rho)^2 on the 4 trainable tokens: 0.5 -> 0.480453, 3.0 -> 1.206949, 1.0 -> 0,
    # 2.5 -> 0.839589; their mean 2.526991 / 4 = 0.631748
    w, mask, m = run("m2po", threshold=1.0)  # 0.63 <= 1: nothing masked, w = rho
    close(w, [[0.5, 3.0, 1.0], [2.5, 0.0, 0.0]])
    close(m["is/dropped_frac"], 0.0)
    w, mask, m = run("m2po", threshold=0.5)
    # 0.63 > 0.5; mask 3.0 (the largest): (0.480453 + 0 + 0.839589) / 3 = 0.440014 <= 0.5
    close(mask, [[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    close(w, [[0.5, 0.0, 1.0], [2.5, 0.0, 0.0]])
    close(m["is/dropped_frac"], 1 / 4)
    w, mask, m = run("m2po")  # threshold 0.04
    # 0.44 > 0.04; then mask 2.5: 0.480453 / 2 = 0.24 > 0.04; then 0.5: 0 / 1 = 0 <= 0.04
    close(mask, [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    close(w, [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
    close(m["is/dropped_frac"], 3 / 4)


def test_m2po_is_not_row_local_and_minpro_is():
    assert CORRECTIONS.trait("m2po", "row_local") is False
    assert CORRECTIONS.trait("minpro", "row_local") is True
