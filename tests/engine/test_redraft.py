"""DAS re-drafting inside decode (reroll.engine.plugins.redraft): exactness (chi-square against
the policy's own completion probabilities), greedy parity, a rejected proposal equal to plain
sampling, rows without a source untouched by rows with one, the counters, the multi-token
cache plan and mask, and the refusals."""

import numpy as np
import pytest
import torch
from engine_helpers import assert_sampled_as, make
from test_drafts import PROMPT, TEMP, TOPK, N, _chi2, _greedy, qwen, top  # noqa: F401

from reroll.engine import TorchEngine
from reroll.engine.kv_cache import extend_mask
from reroll.rollout import BranchRule, Rollout, StopRule, SuffixSource


def test_extend_mask_lets_query_j_of_a_row_see_its_positions_up_to_pos_plus_j(device):
    pos, ar = torch.tensor([1, 3], device=device), torch.arange(8, device=device)
    m = extend_mask(pos, 2, 5, ar, torch.float32, False)  # [2, 1, 2, 5]
    assert m.shape == (2, 1, 2, 5)
    assert m[0, 0].int().tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]]
    assert m[1, 0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    add = extend_mask(pos, 2, 5, ar, torch.float32, True)
    assert add[0, 0, 0, 2] == torch.finfo(torch.float32).min and add[0, 0, 0, 1] == 0


def test_a_source_of_its_own_greedy_response_is_accepted_in_four_token_drafts(lm):
    model, tok = lm
    ref = _greedy(model, tok, "12+34=", 20)
    r = make(tok, "12+34=", temperature=0.0, max_new_tokens=20)
    r.sampling.redraft = SuffixSource((tuple(ref.response_tokens),))
    eng = TorchEngine(model, tok)
    eng.generate([r])
    assert r.tokens == ref.tokens and r.finish == "length"
    assert max(abs(a - b) for a, b in zip(r.logprobs, ref.logprobs, strict=True)) < 1e-4
    L = r.prompt_len
    # the first token comes from the prefill; each decode step feeds the last token with a
    # 4-token draft (mean response length 20 > tokens generated), all kept, then samples one;
    # the fourth step's draft reaches the 20-token limit and ends the request inside it
    assert [(s.start - L, s.end - L, s.source) for s in r.spans[1:]] == [
        (0, 1, "sampled"), (1, 5, "draft"), (5, 6, "sampled"), (6, 10, "draft"),
        (10, 11, "sampled"), (11, 15, "draft"), (15, 16, "sampled"), (16, 20, "draft")]
    s = eng.stats()
    assert (s["redraft_steps"], s["redraft_tokens_proposed"], s["redraft_tokens_accepted"],
            s["tokens_generated"], s["decode_steps"]) == (4, 16, 16, 4, 4)


def test_greedy_with_redrafting_equals_greedy_without(lm):
    model, tok = lm
    prompts = ["12+34=", "7*8=", "abc", "sort: 9 1 5 3 -> "]
    refs = [_greedy(model, tok, p, 24) for p in prompts]
    # sources: each prompt's response with every fifth token changed, and another's response
    rs = []
    for i, p in enumerate(prompts):
        own = [(t + 1) % 50 if j % 5 == 4 else t for j, t in enumerate(refs[i].response_tokens)]
        r = make(tok, p, temperature=0.0, max_new_tokens=24)
        r.sampling.redraft = SuffixSource((tuple(own), tuple(refs[i - 1].response_tokens)),
                                          draft_len=3)
        rs.append(r)
    eng = TorchEngine(model, tok, max_batch=4)
    eng.generate(rs)
    for r, ref in zip(rs, refs, strict=True):
        assert r.tokens == ref.tokens
        assert max(abs(a - b) for a, b in zip(r.logprobs, ref.logprobs, strict=True)) < 1e-4
    s = eng.stats()
    assert s["redraft_tokens_accepted"] > 0
    assert s["redraft_tokens_proposed"] > s["redraft_tokens_accepted"]
    assert any(sp.source == "draft" for r in rs for sp in r.spans)


def test_a_proposal_rejected_at_its_first_token_equals_plain_sampling_with_the_seed(lm):
    model, tok = lm
    kw = dict(temperature=1.0, top_k=5, max_new_tokens=16, seed=77)
    prompt = "sort: 9 1 5 3 -> "
    plain = make(tok, prompt, **kw)
    TorchEngine(model, tok).generate([plain])
    a, b = plain.response_tokens[:2]
    resp = plain.response_tokens
    # the bigram (a, b) occurs only at the start of the response: the one step proposing
    assert all(tuple(resp[j:j + 2]) != (a, b) for j in range(1, len(resp) - 1))
    with torch.no_grad():
        ids = torch.tensor([plain.prompt_tokens + [a, b]], device=model.device)
        nxt = model(input_ids=ids).logits[0, -1]
    outside = int(nxt.argsort()[0])  # the least likely token: outside the top 5, p = 0
    r = make(tok, prompt, **kw)
    r.sampling.redraft = SuffixSource(((a, b, outside),), min_match=2, max_match=2)
    eng = TorchEngine(model, tok)
    other = make(tok, "hello world ", temperature=1.0, max_new_tokens=9, seed=1)
    eng.add([other, r])
    while eng.pending():
        eng.step()
    assert_sampled_as(r, plain, model)
    s = eng.stats()
    assert (s["redraft_steps"], s["redraft_tokens_proposed"], s["redraft_tokens_accepted"]) \
        == (1, 1, 0)


def test_rows_without_a_source_sample_what_they_sample_without_any(lm):
    model, tok = lm
    prompts = ["hello world ", "7*8=", "(1+2)*3=?"]
    refs = {p: _greedy(model, tok, p, 12) for p in ["12+34=", "abc"]}

    def batch(with_sources: bool) -> list[Rollout]:
        rs = [make(tok, p, temperature=0.9, max_new_tokens=12, seed=5 + i)
              for i, p in enumerate(prompts)]
        for p, ref in refs.items():
            r = make(tok, p, temperature=0.0, max_new_tokens=12)
            if with_sources:
                r.sampling.redraft = SuffixSource((tuple(ref.response_tokens),), draft_len=2)
            rs.append(r)
        eng = TorchEngine(model, tok, max_batch=8)
        eng.generate(rs)
        assert (eng.stats()["redraft_tokens_accepted"] > 0) == with_sources
        return rs

    plain, mixed = batch(False), batch(True)
    for a, b in zip(plain, mixed, strict=True):
        assert a.tokens == b.tokens and a.versions == b.versions
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5
    assert [s.source for s in mixed[0].spans] == ["prompt", "sampled"]


def test_redrafting_beside_a_branch_rule_or_in_a_fork_is_refused(lm):
    model, tok = lm
    r = make(tok, "abc", max_new_tokens=4, branch_rule=BranchRule())
    r.sampling.redraft = SuffixSource(((1, 2),))
    with pytest.raises(ValueError, match="sampling.branch_rule together"):
        TorchEngine(model, tok).add([r])
    eng = TorchEngine(model, tok)
    parent = make(tok, "abc", max_new_tokens=8, seed=1)
    parent.sampling.redraft = SuffixSource(((1, 2),))
    eng.add([parent])
    with pytest.raises(ValueError, match="forks do not support"):
        eng.fork(parent, [make(tok, "abc", max_new_tokens=8)], parent.prompt_len + 1)


# ---- distributions ------------------------------------------------------------------

def _policy3(model, tok) -> dict[tuple[int, ...], float]:
    """Exact probabilities of every three-token completion under top-3 at temperature 0.7."""
    ids = tok.encode(PROMPT)
    return {(a, b, c): pa * pb * pc for a, pa in top(model, ids).items()
            for b, pb in top(model, ids + [a]).items()
            for c, pc in top(model, ids + [a, b]).items()}


def test_redrafting_keeps_the_policys_distribution_whatever_the_sources(qwen):  # noqa: F811
    model, tok = qwen
    probs = _policy3(model, tok)
    firsts = sorted({k[0] for k in probs})
    later = sorted({t for k in probs for t in k[1:]})
    pool = later + [max(later) + 1, max(firsts) + 2]  # plus tokens the policy never keeps
    rng = np.random.default_rng(1)
    keys = sorted(probs)
    p = np.array([probs[k] for k in keys])
    rs = []
    for i in range(N):
        # one response drawn from the policy itself (often kept), two from a wrong one
        likely = keys[int(rng.choice(len(keys), p=p / p.sum()))]
        src = (likely,) + tuple((int(rng.choice(firsts)),) + tuple(int(x) for x in
                                rng.choice(pool, 3)) for _ in range(2))
        r = make(tok, PROMPT, gid=str(i), temperature=TEMP, top_k=TOPK, max_new_tokens=3,
                 seed=20_000 + i)
        r.sampling.redraft = SuffixSource(src, draft_len=2)
        rs.append(r)
    eng = TorchEngine(model, tok, max_batch=64, max_prefill_tokens=4096)
    eng.generate(rs)
    counts: dict[tuple[int, ...], int] = {}
    for r in rs:
        counts[tuple(r.response_tokens)] = counts.get(tuple(r.response_tokens), 0) + 1
    assert _chi2(counts, probs) > 1e-3
    s = eng.stats()
    assert s["redraft_tokens_accepted"] > 0.1 * N  # the sources did propose kept tokens
    assert any(sp.source == "draft" and sp.end - sp.start == 2 for r in rs for sp in r.spans)
    assert s["redraft_tokens_proposed"] > s["redraft_tokens_accepted"]


def test_a_stop_token_or_a_stop_rule_inside_an_accepted_draft_ends_it_as_without_drafts(lm):
    model, tok = lm
    ref = _greedy(model, tok, "abc", 16)
    resp = ref.response_tokens
    stop = next(resp[i] for i in range(3, 9) if resp[i] not in resp[:i])  # first seen there
    src = SuffixSource((tuple(resp),), draft_len=8)
    for kw in (dict(stop_token_ids=[stop]),
               dict(stop_rule=StopRule(tuple(resp[3:5]), grace=3))):
        plain = make(tok, "abc", temperature=0.0, max_new_tokens=16, **kw)
        TorchEngine(model, tok).generate([plain])
        r = make(tok, "abc", temperature=0.0, max_new_tokens=16, **kw)
        r.sampling.redraft = src
        eng = TorchEngine(model, tok)
        eng.generate([r])
        assert r.tokens == plain.tokens and r.finish == plain.finish == "stop"
        assert len(r.response_tokens) < 16 and eng.stats()["redraft_tokens_accepted"] > 0
        assert r.spans[-1].source == "draft"  # it ended inside a draft


def test_redrafting_with_the_eager_attention_mask_equals_greedy(lm):
    model, tok = lm
    ref = _greedy(model, tok, "7*8=", 16)
    model.set_attn_implementation("eager")
    try:
        r = make(tok, "7*8=", temperature=0.0, max_new_tokens=16)
        r.sampling.redraft = SuffixSource((tuple(ref.response_tokens[:9]),), draft_len=3)
        eng = TorchEngine(model, tok)
        assert eng.additive
        eng.generate([r])
    finally:
        model.set_attn_implementation("sdpa")
    assert r.tokens == ref.tokens and eng.stats()["redraft_tokens_accepted"] > 0
    assert max(abs(a - b) for a, b in zip(r.logprobs, ref.logprobs, strict=True)) < 1e-4


def test_drafts_stay_below_max_seq_len_for_every_row_of_the_step(lm):
    model, tok = lm
    prompts = ["sort: 9 1 5 3 -> ", "abc"]  # the long prompt nears the end of the cache first
    refs = []
    for p in prompts:
        r = make(tok, p, temperature=0.0, max_new_tokens=40)
        TorchEngine(model, tok, max_seq_len=28).generate([r])
        refs.append(r)
    assert len(refs[0].tokens) == 28  # cut by the cache length, not max_new_tokens
    rs = []
    for p, ref in zip(prompts, refs, strict=True):
        r = make(tok, p, temperature=0.0, max_new_tokens=40)
        r.sampling.redraft = SuffixSource((tuple(ref.response_tokens),), draft_len=8,
                                          max_draft=8)
        rs.append(r)
    eng = TorchEngine(model, tok, max_seq_len=28)
    eng.generate(rs)
    for r, ref in zip(rs, refs, strict=True):
        assert r.tokens == ref.tokens and r.finish == ref.finish == "length"
    assert eng.stats()["redraft_tokens_accepted"] > 0


def test_rows_past_the_mean_response_length_get_longer_drafts(lm):
    model, tok = lm
    ref = _greedy(model, tok, "12+34=", 20)
    # three one-token responses bring the mean length to round(23 / 4) = 6: drafts of 2
    # tokens below 6 generated, 4 from 6, 6 from 12, 8 from 18 (cut by the 20-token limit)
    src = SuffixSource((tuple(ref.response_tokens), (1,), (2,), (3,)), draft_len=2)
    r = make(tok, "12+34=", temperature=0.0, max_new_tokens=20)
    r.sampling.redraft = src
    eng = TorchEngine(model, tok)
    eng.generate([r])
    assert r.tokens == ref.tokens
    L = r.prompt_len
    assert [(s.start - L, s.end - L, s.source) for s in r.spans[1:]] == [
        (0, 1, "sampled"), (1, 3, "draft"), (3, 4, "sampled"), (4, 6, "draft"),
        (6, 7, "sampled"), (7, 11, "draft"), (11, 12, "sampled"), (12, 18, "draft"),
        (18, 19, "sampled"), (19, 20, "draft")]
    assert eng.stats()["redraft_tokens_proposed"] == 2 + 2 + 4 + 6 + 1


def test_a_seeded_request_resumed_after_an_abort_samples_what_it_samples_uninterrupted(lm):
    model, tok = lm
    src = SuffixSource((tuple(_greedy(model, tok, "12+34=", 24).response_tokens),), draft_len=3)

    def req(seed):
        r = make(tok, "12+34=", temperature=0.7, max_new_tokens=24, seed=seed)
        r.sampling.redraft = src
        return r

    for seed in range(20):
        a = req(seed)
        TorchEngine(model, tok).generate([a])
        b = req(seed)
        eng = TorchEngine(model, tok)
        eng.add([b])
        for _ in range(3):
            eng.step()
        eng.abort([b.sample_id])
        eng.generate([b])  # re-prefilled: it verifies the proposal it had next, as a draft
        assert b.tokens == a.tokens and b.resume_count == 1, seed
        assert [(s.start, s.end, s.source) for s in b.spans] == [
            (s.start, s.end, s.source) for s in a.spans]


def test_a_seeded_row_drafts_and_samples_the_same_beside_a_row_near_max_seq_len(lm):
    model, tok = lm
    src = SuffixSource((tuple(_greedy(model, tok, "abc", 24).response_tokens),), draft_len=4,
                       max_draft=4)
    for seed in range(30):
        rows = []
        for batch in (False, True):
            r = make(tok, "abc", temperature=0.3, max_new_tokens=24, seed=seed)
            r.sampling.redraft = src
            long = make(tok, "sort: 9 1 5 3 -> 2 4 6", temperature=0.7, max_new_tokens=40,
                        seed=seed)  # its sequence nears the end of the cache first
            TorchEngine(model, tok, max_seq_len=32).generate([r, long] if batch else [r])
            rows.append(r)
        assert rows[0].tokens == rows[1].tokens, seed
        assert [(s.start, s.end, s.source) for s in rows[0].spans] == [
            (s.start, s.end, s.source) for s in rows[1].spans]
