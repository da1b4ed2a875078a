"""The sampling math on hand-made logits: which token, which log-prob, which random number.

The engine runs it on the model's device, so most tests run on ``--device``; the ones that
put ``u`` or ``top_p`` exactly on a boundary of the CDF stay on the CPU, whose rounding they
pin down (another device's exp/cumsum may land an ulp to either side)."""

import math

import torch

from reroll.engine.sampling import sample, seed_key, splitmix64, uniforms

LOGITS = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))  # probabilities 0.5, 0.3, 0.2


def one(logits, temperature=1.0, top_k=0, top_p=1.0, u=0.0, device="cpu", **hints):
    z = dict(device=device)
    tok, lp = sample(logits.to(device), torch.tensor([temperature], **z),
                     torch.tensor([top_k], **z), torch.tensor([top_p], **z),
                     torch.tensor([u], **z), **hints)
    return int(tok), float(lp)


def test_splitmix64_matches_the_reference_sequence(device):
    # splitmix64 with state 0 outputs 0xE220A8397B1DCDAF first, 0x6E789E6AA1B965F4 second
    golden = 0x9E3779B97F4A7C15
    out = splitmix64(torch.tensor([0, golden - 2**64], device=device))
    assert [v & (2**64 - 1) for v in out.tolist()] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]
    # the pure-Python key function is the same hash
    assert [seed_key(0) & (2**64 - 1), seed_key(golden) & (2**64 - 1)] == [
        0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4]


def test_inverse_cdf_picks_the_token_whose_interval_holds_u():  # CPU: u on the boundaries
    # cumulative 0.5, 0.8, 1.0: u=0.49 -> 0, u=0.5 -> 1, u=0.79 -> 1, u=0.81 -> 2
    for hints in ({}, {"any_greedy": False, "any_filter": False}):
        assert [one(LOGITS, u=u, **hints)[0] for u in (0.49, 0.5, 0.79, 0.81)] == [0, 1, 1, 2]
    assert math.isclose(one(LOGITS, u=0.81)[1], math.log(0.2), abs_tol=1e-6)


def test_temperature_scales_logits_before_the_softmax(device):
    # logits [0, ln 4] at T=2 -> [0, ln 2] -> probabilities 1/3, 2/3
    logits = torch.tensor([[0.0, math.log(4.0)]])
    tok, lp = one(logits, temperature=2.0, u=0.9, device=device)
    assert tok == 1 and math.isclose(lp, math.log(2 / 3), abs_tol=1e-6)


def test_top_p_keeps_the_token_that_crosses_the_threshold_and_renormalises():  # CPU: p = 0.5
    # top_p=0.7: mass before token 0 is 0 < 0.7, before token 1 is 0.5 < 0.7, before 2 is 0.8
    # -> keep {0, 1}, renormalised 0.5/0.8 = 0.625 and 0.3/0.8 = 0.375
    tok, lp = one(LOGITS, top_p=0.7, u=0.7)
    assert tok == 1 and math.isclose(lp, math.log(0.375), abs_tol=1e-6)
    tok, lp = one(LOGITS, top_p=0.7, u=0.999)  # never the filtered token 2
    assert tok == 1
    tok, lp = one(LOGITS, top_p=0.5, u=0.99)  # mass before token 1 is 0.5, not < 0.5
    assert tok == 0 and math.isclose(lp, 0.0, abs_tol=1e-6)


def test_top_k_restricts_to_the_k_largest_logits(device):
    # top_k=2 keeps probabilities 0.5, 0.3 -> 0.625, 0.375
    tok, lp = one(LOGITS, top_k=2, u=0.1, device=device)
    assert tok == 0 and math.isclose(lp, math.log(0.625), abs_tol=1e-6)
    tok, lp = one(LOGITS, top_k=1, u=0.99, device=device)
    assert tok == 0 and math.isclose(lp, 0.0, abs_tol=1e-6)


def test_greedy_takes_argmax_and_records_the_temperature_one_logprob(device):
    # temperature 0 ignores top-k/top-p and u; log-prob is log 0.5 under the raw logits
    for kw in ({}, {"top_k": 1, "top_p": 0.3}):
        tok, lp = one(LOGITS, temperature=0.0, u=0.99, device=device, **kw)
        assert tok == 0 and math.isclose(lp, math.log(0.5), abs_tol=1e-6)


def test_rows_of_one_batch_use_their_own_parameters(device):
    z = dict(device=device)
    logits = LOGITS.to(device).repeat(3, 1)
    tok, lp = sample(logits, torch.tensor([0.0, 1.0, 1.0], **z), torch.tensor([0, 0, 2], **z),
                     torch.tensor([1.0, 1.0, 1.0], **z), torch.tensor([0.9, 0.9, 0.9], **z))
    # greedy -> 0 (log .5); plain u=.9 -> 2 (log .2); top-2: .9 > .625 -> 1 (log .375)
    assert tok.tolist() == [0, 2, 1]
    assert torch.allclose(lp.cpu(), torch.log(torch.tensor([0.5, 0.2, 0.375])), atol=1e-6)


def test_uniforms_depend_only_on_seed_and_position(device):
    seeds, posn = torch.tensor([5, 5, 6, 5]), torch.tensor([10, 11, 10, 10])
    u = uniforms(seeds.to(device), posn.to(device))
    assert u[0] == u[3] and u[0] != u[1] and u[0] != u[2]
    assert uniforms(seeds[:1].to(device), posn[:1].to(device)) == u[0]  # alone as in a batch
    assert torch.equal(u.cpu(), uniforms(seeds, posn))  # bit for bit the CPU's numbers
    big = uniforms(torch.zeros(20000, dtype=torch.long, device=device),
                   torch.arange(20000, device=device))
    assert 0.0 <= float(big.min()) and float(big.max()) < 1.0
    assert abs(float(big.mean()) - 0.5) < 0.01  # sd of the mean: 0.289/sqrt(20000) = 0.002


def test_sampled_frequencies_follow_the_probabilities(device):
    # 20,000 draws from (0.5, 0.3, 0.2): each frequency within 0.015 (> 4 sd of 0.0035)
    n, z = 20000, dict(device=device)
    u = uniforms(torch.full((n,), 3, **z), torch.arange(n, **z))
    tok, _ = sample(LOGITS.to(device).repeat(n, 1), torch.ones(n, **z),
                    torch.zeros(n, dtype=torch.long, **z), torch.ones(n, **z), u,
                    any_greedy=False, any_filter=False)
    freq = torch.bincount(tok.cpu(), minlength=3).float() / n  # CUDA's is nondeterministic
    assert torch.allclose(freq, torch.tensor([0.5, 0.3, 0.2]), atol=0.015)


def test_a_rows_token_does_not_depend_on_what_else_is_in_the_batch(device):
    z = dict(device=device)
    logits = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).to(device)
    u = torch.tensor([0.55], **z)
    alone = sample(logits, torch.ones(1, **z), torch.zeros(1, dtype=torch.long, **z),
                   torch.ones(1, **z), u, any_greedy=False, any_filter=False)
    # the same row next to a greedy row and a top-p row takes the filtered code path
    tok, lp = sample(logits.repeat(3, 1), torch.tensor([1.0, 0.0, 1.0], **z),
                     torch.tensor([0, 0, 0], **z), torch.tensor([1.0, 1.0, 0.5], **z),
                     u.repeat(3))
    # cumulative 0.1, 0.3, 0.6, 1.0 and u = 0.55 -> token 2 with log 0.3
    assert int(alone[0]) == int(tok[0]) == 2
    assert math.isclose(float(lp[0]), math.log(0.3), abs_tol=1e-6)
    assert math.isclose(float(alone[1]), float(lp[0]), abs_tol=1e-7)
