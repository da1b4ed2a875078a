"""The sampling math on hand-made logits: which token, which log-prob, which random number."""

import math

import torch

from reroll.engine.sampling import sample, seed_key, splitmix64, uniforms

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))  # probabilities 0.5, 0.3, 0.2


def one(logits, temperature=1.0, top_k=0, top_p=1.0, u=0.0, **hints):
    tok, lp = sample(logits, torch.tensor([temperature]), torch.tensor([top_k]),
                     torch.tensor([top_p]), torch.tensor([u]), **hints)
    return int(tok), float(lp)


def test_splitmix64_matches_the_reference_sequence():
    # splitmix64 with state 0 outputs 0xE220A8397B1DCDAF first, 0x6E789E6AA1B965F4 second
    golden = 0x9E3779B97F4A7C15
    out = splitmix64(torch.tensor([0, golden - 2**64]))
    assert [v & (2**64 - 1) for v in out.tolist()] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    # the pure-Python key function is the same hash
    assert [seed_key(0) & (2**64 - 1), seed_key(golden) & (2**64 - 1)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


def test_inverse_cdf_picks_the_token_whose_interval_holds_u():
    # cumulative 0.5, 0.8, 1.0: u=0.49 -> 0, u=0.5 -> 1, u=0.79 -> 1, u=0.81 -> 2
    for hints in ({}, {"any_greedy": False, "any_filter": False}):
        assert [one(LOGITS, u=u, **hints)[0] for u in (0.49, 0.5, 0.79, 0.81)] == [0, 1, 1, 2]
    assert math.isclose(one(LOGITS, u=0.81)[1], math.log(0.2), abs_tol=1e-6)


def test_temperature_scales_logits_before_the_softmax():
    # logits [0, ln 4] at T=2 -> [0, ln 2] -> probabilities 1/3, 2/3
    logits = torch.tensor([[0.0, math.log(4.0)]])
    tok, lp = one(logits, temperature=2.0, u=0.9)
    assert tok == 1 and math.isclose(lp, math.log(2 / 3), abs_tol=1e-6)


def test_top_p_keeps_the_token_that_crosses_the_threshold_and_renormalises():
    # top_p=0.7: mass before token 0 is 0 < 0.7, before token 1 is 0.5 < 0.7, before 2 is 0.8
    # -> keep {0, 1}, renormalised 0.5/0.8 = 0.625 and 0.3/0.8 = 0.375
    tok, lp = one(LOGITS, top_p=0.7, u=0.7)
    assert tok == 1 and math.isclose(lp, math.log(0.375), abs_tol=1e-6)
    tok, lp = one(LOGITS, top_p=0.7, u=0.999)  # never the filtered token 2
    assert tok == 1
    tok, lp = one(LOGITS, top_p=0.5, u=0.99)  # mass before token 1 is 0.5, not < 0.5
    assert tok == 0 and math.isclose(lp, 0.0, abs_tol=1e-6)


def test_top_k_restricts_to_the_k_largest_logits():
    # top_k=2 keeps probabilities 0.5, 0.3 -> 0.625, 0.375
    tok, lp = one(LOGITS, top_k=2, u=0.1)
    assert tok == 0 and math.isclose(lp, math.log(0.625), abs_tol=1e-6)
    tok, lp = one(LOGITS, top_k=1, u=0.99)
    assert tok == 0 and math.isclose(lp, 0.0, abs_tol=1e-6)


def test_greedy_takes_argmax_and_records_the_temperature_one_logprob():
    # temperature 0 ignores top-k/top-p and u; log-prob is log 0.5 under the raw logits
    for kw in ({}, {"top_k": 1, "top_p": 0.3}):
        tok, lp = one(LOGITS, temperature=0.0, u=0.99, **kw)
        assert tok == 0 and math.isclose(lp, math.log(0.5), abs_tol=1e-6)


def test_rows_of_one_batch_use_their_own_parameters():
    logits = LOGITS.repeat(3, 1)
    tok, lp = sample(logits, torch.tensor([0.0, 1.0, 1.0]), torch.tensor([0, 0, 2]),
                     torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.9, 0.9, 0.9]))
    # greedy -> 0 (log .5); plain u=.9 -> 2 (log .2); top-2: .9 > .625 -> 1 (log .375)
    assert tok.tolist() == [0, 2, 1]
    assert torch.allclose(lp, torch.log(torch.tensor([0.5, 0.2, 0.375])), atol=1e-6)


def test_uniforms_depend_only_on_seed_and_position():
    seeds, posn = torch.tensor([5, 5, 6, 5]), torch.tensor([10, 11, 10, 10])
    u = uniforms(seeds, posn)
    assert u[0] == u[3] and u[0] != u[1] and u[0] != u[2]
    assert uniforms(seeds[:1], posn[:1]) == u[0]  # same value alone as in a batch
    big = uniforms(torch.zeros(20000, dtype=torch.long), torch.arange(20000))
    assert 0.0 <= float(big.min()) and float(big.max()) < 1.0
    assert abs(float(big.mean()) - 0.5) < 0.01  # sd of the mean: 0.289/sqrt(20000) = 0.002


def test_sampled_frequencies_follow_the_probabilities():
    # 20,000 draws from (0.5, 0.3, 0.2): each frequency within 0.015 (> 4 sd of 0.0035)
    n = 20000
    u = uniforms(torch.full((n,), 3), torch.arange(n))
    tok, _ = sample(LOGITS.repeat(n, 1), torch.ones(n), torch.zeros(n, dtype=torch.long),
                    torch.ones(n), u, any_greedy=False, any_filter=False)
    freq = torch.bincount(tok, minlength=3).float() / n
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.015)


def test_a_rows_token_does_not_depend_on_what_else_is_in_the_batch():
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]]))
    u = torch.tensor([0.55])
    alone = sample(logits, torch.ones(1), torch.zeros(1, dtype=torch.long), torch.ones(1), u,
                   any_greedy=False, any_filter=False)
    # the same row next to a greedy row and a top-p row takes the filtered code path
    tok, lp = sample(logits.repeat(3, 1), torch.tensor([1.0, 0.0, 1.0]),
                     torch.tensor([0, 0, 0]), torch.tensor([1.0, 1.0, 0.5]),
                     u.repeat(3))
    # cumulative 0.1, 0.3, 0.6, 1.0 and u = 0.55 -> token 2 with log 0.3
    assert int(alone[0]) == int(tok[0]) == 2
    assert math.isclose(float(lp[0]), math.log(0.3), abs_tol=1e-6)
    assert math.isclose(float(alone[1]), float(lp[0]), abs_tol=1e-7)
