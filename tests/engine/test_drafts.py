"""Draft verification in TorchEngine (reroll.engine.speculative): the acceptance rule by hand,
the residual draw, the two rules for the rejected position (distributions by hand), exactness at lenience 1 (chi-square against the policy's own completion
probabilities), the shift lenience > 1 causes, bitwise agreement with plain sampling, the
records' spans and log-probs."""

import math

import numpy as np
import pytest
import torch
from engine_helpers import assert_sampled_as, forward_atol, full_logprobs, make, spread
from scipy.stats import chisquare

from reroll.config import ModelConfig
from reroll.engine import TorchEngine
from reroll.engine.sampling import sample
from reroll.engine.speculative import acceptance, first_rejection, resample_ban
from reroll.models import build_tiny, load
from reroll.rollout import Draft, Rollout


def test_acceptance_is_lenience_times_the_probability_ratio_capped_at_one():
    logp = torch.log(torch.tensor([0.2, 0.2, 0.0]))
    q = torch.log(torch.tensor([0.5, 0.1, 0.5]))
    # 1 * 0.2/0.5 = 0.4; 0.2/0.1 = 2 -> 1; 0/0.5 = 0
    assert torch.allclose(acceptance(logp, q, 1.0), torch.tensor([0.4, 1.0, 0.0]))
    # 2 * 0.4 = 0.8; 3 * 0.4 = 1.2 -> 1
    assert torch.allclose(acceptance(logp, q, 2.0)[0], torch.tensor(0.8))
    assert float(acceptance(logp, q, 3.0)[0]) == 1.0
    # a deterministic draft (q = 1): the probability itself
    assert torch.allclose(acceptance(logp, None, 1.0), torch.tensor([0.2, 0.2, 0.0]))


def test_first_rejection_is_the_first_uniform_at_or_above_its_acceptance():
    a = torch.tensor([0.5, 0.9, 0.1])
    assert first_rejection(a, torch.tensor([0.4, 0.95, 0.0])) == 1  # 0.95 >= 0.9
    assert first_rejection(a, torch.tensor([0.4, 0.5, 0.05])) == 3  # all below: all kept
    assert first_rejection(a, torch.tensor([0.5, 0.0, 0.0])) == 0  # u == a rejects


def test_the_residual_draw_leaves_the_banned_token_out_and_records_the_full_logprob(device):
    z = dict(device=device)  # the engine draws on the model's device
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).to(device)
    one, k0, p1 = torch.ones(1, **z), torch.zeros(1, dtype=torch.long, **z), torch.ones(1, **z)
    # without token 0 the residual is (0, 0.6, 0.4): cdf (0, 0.6, 1.0), u = 0.5 -> token 1
    tok, lp = sample(logits, one, k0, p1, torch.tensor([0.5], **z), ban=torch.tensor([0], **z))
    assert int(tok) == 1 and abs(float(lp) - math.log(0.3)) < 1e-6  # log p, not log 0.6
    # no ban (-1): cdf (0.5, 0.8, 1.0), u = 0.5 -> token 1 as well, u = 0.4 -> token 0
    tok, _ = sample(logits, one, k0, p1, torch.tensor([0.4], **z), ban=torch.tensor([-1], **z))
    assert int(tok) == 0
    # banning a token top-k already removed changes nothing, bit for bit
    k2 = torch.tensor([2], **z)
    u = torch.tensor([0.7], **z)
    plain = sample(logits, one, k2, p1, u)
    banned = sample(logits, one, k2, p1, u, ban=torch.tensor([2], **z))
    assert torch.equal(plain[0], banned[0]) and torch.equal(plain[1], banned[1])


def _rejected_position_distribution(rule: str, device) -> list[float]:
    """The distribution of the token at a one-token deterministic draft's position (drafted
    token 0, policy p = (0.5, 0.3, 0.2)), over a 200 x 200 grid of (acceptance, draw)
    uniforms: the draft kept when u_acc < p(0), else a draw by ``rule``."""
    z = dict(device=device)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]])).to(device)
    one, k0, p1 = torch.ones(1, **z), torch.zeros(1, dtype=torch.long, **z), torch.ones(1, **z)
    a = acceptance(torch.log(torch.tensor([0.5])), None, 1.0)
    grid = [(i + 0.5) / 200 for i in range(200)]
    counts = [0, 0, 0]
    for ua in grid:
        n = first_rejection(a, torch.tensor([ua]))
        if n == 1:
            counts[0] += len(grid)
            continue
        ban = torch.tensor([resample_ban((0,), n, rule)], **z)
        toks, _ = sample(logits.expand(len(grid), 3), one.expand(len(grid)),
                         k0.expand(len(grid)), p1.expand(len(grid)),
                         torch.tensor(grid, **z), ban=ban.expand(len(grid)))
        for t in toks.tolist():
            counts[t] += 1
    return [c / len(grid) ** 2 for c in counts]


def test_the_rejected_position_is_drawn_by_the_drafts_rule(device):
    assert resample_ban((4, 5), 1, "residual") == 5 and resample_ban((4, 5), 1, "full") == -1
    assert resample_ban((4, 5), 2, "residual") == -1  # all kept: nothing to leave out
    # "residual": kept w.p. 0.5, else (0, 0.6, 0.4): exactly p = (0.5, 0.3, 0.2)
    res = _rejected_position_distribution("residual", device)
    assert res == pytest.approx([0.5, 0.3, 0.2], abs=1e-12)
    # "full" (SPEC-RL): kept w.p. 0.5, else p again: (0.5 + 0.25, 0.15, 0.1)
    full = _rejected_position_distribution("full", device)
    assert full == pytest.approx([0.75, 0.15, 0.1], abs=1e-12)


@pytest.mark.parametrize("rule", ["full", "residual"])
def test_a_draft_rejected_at_its_sampled_token_resamples_by_its_rule(lm, rule):
    model, tok = lm
    kw = dict(temperature=1.0, top_k=5, max_new_tokens=12, seed=5)
    plain = make(tok, "sort: 4 2 8 -> ", **kw)
    TorchEngine(model, tok).generate([plain])
    # the plain sample's own first token, recorded with q = e^50: a = p / q ~ 0, rejected
    r = make(tok, "sort: 4 2 8 -> ", **kw)
    r.sampling.draft = Draft(tuple(plain.response_tokens[:3]), (50.0,) * 3, resample=rule)
    TorchEngine(model, tok).generate([r])
    if rule == "full":  # the whole distribution, the sampler's own uniform: plain sampling
        assert_sampled_as(r, plain, model)
    else:  # the drafted token is left out of the draw
        assert r.response_tokens[0] != plain.response_tokens[0]
        assert [s.source for s in r.spans] == ["prompt", "sampled"]


def test_draft_validation_names_the_draft():
    with pytest.raises(ValueError, match="resample must be"):
        Draft((1,), resample="nearest")
    with pytest.raises(ValueError, match="lenience must be >= 1"):
        Draft((1, 2), lenience=0.5, source="s1")
    with pytest.raises(ValueError, match="1 logprobs for 2 tokens"):
        Draft((1, 2), logprobs=(-1.0,), source="s1")


def test_a_rollout_with_a_draft_round_trips_through_json():
    r = Rollout(prompt_id="p", group_id="g", tokens=[1, 2], prompt_len=2)
    r.sampling.draft = Draft((3, 4), (-0.5, -0.25), 1.5, source="abc")
    back = Rollout.from_json(r.to_json())
    assert back.sampling.draft == r.sampling.draft


def test_draft_tokens_outside_the_vocabulary_are_refused(lm):
    model, tok = lm
    r = make(tok, "7*8=", max_new_tokens=4)
    r.sampling.draft = Draft((10**6,))
    with pytest.raises(ValueError, match="draft token ids"):
        TorchEngine(model, tok).add([r])


# ---- the engine ---------------------------------------------------------------------

def _greedy(model, tok, prompt: str, n: int) -> Rollout:
    r = make(tok, prompt, temperature=0.0, max_new_tokens=n)
    TorchEngine(model, tok).generate([r])
    return r


def test_a_fully_accepted_draft_records_the_policys_logprobs_and_samples_nothing(lm):
    model, tok = lm
    ref = _greedy(model, tok, "12+34=", 12)
    # temperature 1 with the draft's own probabilities as q and a huge lenience: every token
    # with p > 0 is kept, so the whole draft is reused
    r = make(tok, "12+34=", temperature=1.0, max_new_tokens=12, seed=3)
    r.sampling.draft = Draft(tuple(ref.response_tokens), (0.0,) * 12, lenience=1e9)
    eng = TorchEngine(model, tok)
    eng.generate([r])
    assert r.tokens == ref.tokens and r.finish == "length"
    assert [(s.start, s.end, s.source, s.version) for s in r.spans] == [
        (0, r.prompt_len, "prompt", -1), (r.prompt_len, r.prompt_len + 12, "draft", 0)]
    assert all(r.loss_mask[r.prompt_len:]) and set(r.versions[r.prompt_len:]) == {0}
    want = full_logprobs(model, r.tokens)[r.prompt_len - 1:]  # [12] from a plain forward
    got = torch.tensor(r.logprobs[r.prompt_len:])
    # one extend forward over the draft against one full forward: other kernel shapes
    torch.testing.assert_close(got, want, rtol=0.0, atol=forward_atol(model, want))
    s = eng.stats()
    assert s["tokens_generated"] == 0 and s["draft_tokens_accepted"] == 12


def test_a_partly_accepted_draft_samples_on_from_the_first_rejection(lm):
    model, tok = lm
    ref = _greedy(model, tok, "7*8=", 10)
    bad = (ref.response_tokens[6] + 1) % 50
    r = make(tok, "7*8=", temperature=0.0, max_new_tokens=10)
    r.sampling.draft = Draft(tuple(ref.response_tokens[:6]) + (bad, 5, 5))
    eng = TorchEngine(model, tok)
    eng.generate([r])
    L = r.prompt_len
    assert r.tokens == ref.tokens  # greedy keeps the argmax tokens and replaces the rest
    assert [(s.start, s.end, s.source) for s in r.spans] == [
        (0, L, "prompt"), (L, L + 6, "draft"), (L + 6, L + 10, "sampled")]
    # the draft's extend forward against decode steps: other kernel shapes (tokens equal:
    # greedy takes the argmax, which rounding moves only at a near-tie of the top two)
    want = torch.tensor(ref.logprobs[L:])
    torch.testing.assert_close(torch.tensor(r.logprobs[L:]), want, rtol=0.0,
                               atol=forward_atol(model, want))
    s = eng.stats()
    assert (s["draft_tokens_proposed"], s["draft_tokens_accepted"], s["tokens_generated"]) \
        == (9, 6, 4)


def test_an_accepted_stop_token_ends_the_request_inside_the_draft(lm):
    model, tok = lm
    ref = _greedy(model, tok, "abc", 8)
    stop = ref.response_tokens[3]
    r = make(tok, "abc", temperature=0.0, max_new_tokens=8, stop_token_ids=[stop])
    r.sampling.draft = Draft(tuple(ref.response_tokens))
    eng = TorchEngine(model, tok)
    eng.generate([r])
    first = ref.response_tokens.index(stop)
    assert r.response_tokens == ref.response_tokens[:first + 1] and r.finish == "stop"
    assert eng.stats()["tokens_generated"] == 0


def test_a_draft_rejected_at_its_first_token_equals_plain_sampling_with_the_seed(lm):
    model, tok = lm
    kw = dict(temperature=1.0, top_k=5, max_new_tokens=16, seed=77)
    plain = make(tok, "sort: 9 1 5 3 -> ", **kw)
    TorchEngine(model, tok).generate([plain])
    with torch.no_grad():
        first = model(input_ids=torch.tensor([plain.prompt_tokens], device=model.device)
                      ).logits[0, -1]
    outside = int(first.argsort()[0])  # the least likely token: outside the top 5, p = 0
    r = make(tok, "sort: 9 1 5 3 -> ", **kw)
    r.sampling.draft = Draft((outside,) + tuple(plain.response_tokens[1:]))
    eng = TorchEngine(model, tok)
    eng.add([make(tok, "hello world ", temperature=1.0, max_new_tokens=9, seed=1), r])
    while eng.pending():
        eng.step()
    assert_sampled_as(r, plain, model)


# ---- distributions ------------------------------------------------------------------

PROMPT, TOPK, TEMP, N = "7*8=", 3, 0.7, 3000


def _policy(model, tok) -> dict[tuple[int, int], float]:
    """Exact probabilities of every two-token completion under top-3 at temperature 0.7:
    p(a) * p(b | a) over the 3 x 3 kept pairs, from plain forwards."""
    ids = tok.encode(PROMPT)
    return {(a, b): pa * pb for a, pa in top(model, ids).items()
            for b, pb in top(model, ids + [a]).items()}


def top(model, prefix: list[int]) -> dict[int, float]:
    """The top-3 tokens after ``prefix`` at temperature 0.7 and their renormalised
    probabilities, from a plain forward."""
    with torch.no_grad():
        ids = torch.tensor([prefix], device=model.device)
        logits = model(input_ids=ids).logits[0, -1].float() / TEMP
    vals, idx = logits.topk(TOPK)
    return dict(zip(idx.tolist(), torch.softmax(vals, -1).tolist(), strict=True))


def _run(model, tok, drafts: list[Draft | None]) -> dict[tuple[int, int], int]:
    rs = []
    for i, d in enumerate(drafts):
        r = make(tok, PROMPT, gid=str(i), temperature=TEMP, top_k=TOPK, max_new_tokens=2,
                 seed=10_000 + i)
        r.sampling.draft = d
        rs.append(r)
    TorchEngine(model, tok, max_batch=64, max_prefill_tokens=4096).generate(rs)
    counts: dict[tuple[int, int], int] = {}
    for r in rs:
        key = tuple(r.response_tokens)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _chi2(counts: dict, probs: dict) -> float:
    assert set(counts) <= set(probs), "a completion the policy gives probability 0"
    keys = sorted(probs)
    obs = np.array([counts.get(k, 0) for k in keys], dtype=float)
    exp = np.array([probs[k] for k in keys], dtype=float)
    return float(chisquare(obs, exp / exp.sum() * obs.sum()).pvalue)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory, device):
    """The distribution tests run on one architecture (the Qwen2 of conftest), on ``device``."""
    cfg = ModelConfig(arch="qwen2", hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2,
                      intermediate_size=128)
    model, tok = load(build_tiny(cfg, tmp_path_factory.mktemp("qwen2"), seed=0))
    spread(model, seed=7)
    return model.to(device).eval(), tok


def test_lenience_one_keeps_the_policys_distribution_whatever_the_drafts(qwen):
    model, tok = qwen
    probs = _policy(model, tok)
    firsts = sorted({a for a, _ in probs})
    seconds = sorted({b for _, b in probs})
    rng = np.random.default_rng(0)
    # drafts from a wrong distribution: uniform over the kept tokens plus one never kept
    pool_a, pool_b = firsts + [max(seconds) + 1], seconds + [max(firsts) + 2]
    drafts = [Draft((int(rng.choice(pool_a)), int(rng.choice(pool_b)))) for _ in range(N)]
    with_drafts = _run(model, tok, drafts)
    assert _chi2(with_drafts, probs) > 1e-3
    assert _chi2(_run(model, tok, [None] * N), probs) > 1e-3  # plain sampling, the same test


def test_lenience_above_one_shifts_the_distribution_towards_the_drafts(qwen):
    model, tok = qwen
    probs = _policy(model, tok)
    firsts = sorted({a for a, _ in probs})
    # every draft is the policy's least likely completion, recorded with q = 1/3 per token
    least = min(probs, key=probs.get)
    d = Draft(least, (math.log(1 / 3),) * 2, lenience=4.0)
    shifted = _run(model, tok, [d] * N)
    assert _chi2(shifted, probs) < 1e-6
    assert shifted[least] / N > probs[least] + 0.1  # drawn towards the draft
    assert len(firsts) == TOPK
