"""The engine's side of ARRoL (`reroll.engine.plugins.prune`) on a tiny random model: a group
with a scripted head has exactly the expected members pruned at the checkpoint (records,
counts, one prefill, no re-prefill), from the hidden states the decode step computed; the
warm-up cut; a real head's predictions equal the head applied to a reference forward's
hidden states (and to the trainer's `prefix_hidden`); an interrupted group decides the same
in its re-prefill; groups that cannot all fit wait and are admitted together; requests
without a rule are untouched by a loaded head."""

import pytest
import torch
from engine_helpers import forward_atol, make

from reroll.engine import TorchEngine
from reroll.engine.quality import QualityHead, head_tensors, prefix_confidence, rank_draw
from reroll.rollout import PruneRule

AT, PROMPT = 3, "12+34="


def hidden_of(model, tokens: list[int]) -> torch.Tensor:
    """The input of the output embedding at every position of one plain forward on the
    model's device: [L, H], on the CPU."""
    got = []
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda mod, args: got.append(args[0]))
    with torch.no_grad():
        model(input_ids=torch.tensor([tokens], device=model.device))
    hook.remove()
    return got[0][0].float().cpu()


def members(tok, seeds, rule=None, limits=None, gid="g"):
    out = []
    for i, s in enumerate(seeds):
        r = make(tok, PROMPT, gid=gid, temperature=1.0, seed=s,
                 max_new_tokens=(limits or {}).get(i, 8))
        r.index_in_group, r.sampling.prune = i, rule
        out.append(r)
    return out


def distinct_seeds(model, tok, n: int) -> tuple[list[int], dict]:
    """n seeds whose first AT sampled tokens differ pairwise, and each one's free record."""
    rs = members(tok, range(40))
    TorchEngine(model, tok, max_batch=40).generate(rs)
    seeds, seen = [], set()
    for s, r in zip(range(40), rs):
        if tuple(r.response_tokens[:AT]) not in seen and len(seeds) < n:
            seen.add(tuple(r.response_tokens[:AT]))
            seeds.append(s)
    assert len(seeds) == n
    return seeds, {s: rs[s] for s in seeds}


class Scripted:
    """A stand-in head: finds each row's prefix by its hidden state among reference forwards
    (asserting it is one of them, and that ``lp`` is that prefix's log-prob mean and min in
    the free run) and returns the prediction scripted for that prefix."""

    def __init__(self, model, prompt: list[int], free: list, preds: dict):
        self.refs = {}
        for r in free:
            resp, lps = r.response_tokens, r.logprobs[r.prompt_len:]
            h = hidden_of(model, prompt + resp)
            for k in range(len(resp)):
                self.refs[tuple(resp[:k])] = (h[len(prompt) + k - 1], prefix_confidence(lps[:k]))
        self.preds, self.asked = preds, []

    def predict(self, h, k, lp):
        out = []
        for row, kk, conf in zip(h.float().cpu(), k.tolist(), lp.tolist()):
            dist = {p: float((row - v).abs().max()) for p, (v, _) in self.refs.items()
                    if len(p) == kk}
            prefix = min(dist, key=dist.get)
            assert dist[prefix] < 1e-4  # the hidden state after the prompt and kk tokens
            assert conf == pytest.approx(self.refs[prefix][1], abs=1e-5)
            self.asked.append(prefix)
            out.append(self.preds.get(prefix, 0.5))
        return torch.tensor(out)


def engine_with_head(model, tok, warm=True, max_batch=8, head=None):
    e = TorchEngine(model, tok, max_batch=max_batch)
    width = model.get_output_embeddings().in_features
    e.load_head(head_tensors(head or QualityHead(width, AT), warm=warm))
    return e


def test_a_scripted_head_prunes_exactly_the_expected_members_at_the_checkpoint(lm):
    model, tok = lm
    seeds, free = distinct_seeds(model, tok, 6)
    prompt = tok.encode(PROMPT)
    rule = PruneRule(at=AT, keep=3, size=6)
    rs = members(tok, seeds, rule, limits={5: 2})  # member 5 ends after 2 tokens
    resp = [free[s].response_tokens for s in seeds]
    # predictions at the checkpoint (3 tokens) for members 0..4; member 5 is predicted at
    # its last computed position, after 1 token. By the rule (tests/methods/test_arrol.py:
    # test_finished_members_always_survive_and_steer_the_balance) 1 and 3 survive with 5.
    preds = {tuple(resp[i][:AT]): p for i, p in enumerate([0.9, 0.1, 0.6, 0.3, 0.8])}
    preds[tuple(resp[5][:1])] = 0.95
    e = engine_with_head(model, tok)
    e.prune.head = Scripted(model, prompt, [free[s] for s in seeds], preds)
    e.generate(rs)
    assert [r.finish for r in rs] == ["pruned", "length", "pruned", "length", "pruned",
                                      "length"]
    for i in (0, 2, 4):  # cut at exactly 3 tokens, the ones they sampled freely
        assert rs[i].response_tokens == resp[i][:AT]
    for i in (1, 3):  # the survivors sample on as if nothing happened
        assert rs[i].response_tokens == resp[i]
    assert rs[5].response_tokens == resp[5][:2]
    recs = [r.control["arrol"] for r in rs]
    assert [d["decision"] for d in recs] == ["pruned", "kept", "pruned", "kept", "pruned",
                                             "finished"]
    assert [d["p"] for d in recs] == pytest.approx([0.9, 0.1, 0.6, 0.3, 0.8, 0.95])
    assert [d["at"] for d in recs] == [3, 3, 3, 3, 3, 1]
    assert all(d["mode"] == "head" and d["version"] == 0 for d in recs)
    s = e.stats()
    assert s["prefill_forwards"] == 1 and s["prefill_tokens"] == len(prompt)  # shared, once
    assert s["requests_pruned"] == 3 and s["prune_decisions"] == 1
    # every live member was asked once at the checkpoint, none after
    at3 = [p for p in e.prune.head.asked if len(p) == AT]
    assert sorted(at3) == sorted(tuple(resp[i][:AT]) for i in range(5))


def test_before_the_warm_up_ends_the_cut_follows_the_members_own_draws(lm):
    model, tok = lm
    seeds = [11, 12, 13, 14, 15, 16]
    rs = members(tok, seeds, PruneRule(at=AT, keep=4, size=6))
    e = engine_with_head(model, tok, warm=False)
    e.generate(rs)
    draws = sorted((rank_draw(s), i) for i, s in enumerate(seeds))
    kept = {i for _, i in draws[:4]}
    assert {i for i, r in enumerate(rs) if r.finish != "pruned"} == kept
    assert all(r.control["arrol"]["mode"] == "random" for r in rs)
    assert all(r.response_len == AT for r in rs if r.finish == "pruned")


def test_a_real_heads_predictions_are_its_values_on_the_checkpoint_hidden_states(lm, device,
                                                                              monkeypatch):
    from reroll.methods import arrol_head as arrol
    from reroll.methods.arrol_head import prefix_hidden

    model, tok = lm
    # the engine's p comes from a decode step's hidden state, the references' from full
    # forwards (one sequence, or a padded batch): other kernel shapes. p = sigmoid(head(h))
    # lies in (0, 1): the model's reordering bound at scale 1 (forward_atol, the head's two
    # layers counted in place of the output embedding and the normaliser)
    p_atol = forward_atol(model, 1.0)
    width = model.get_output_embeddings().in_features
    head = QualityHead(width, AT, hidden=8, seed=3)
    with torch.no_grad():
        head.net[2].weight.normal_(0, 2.0, generator=torch.Generator().manual_seed(1))
    seeds = [21, 22, 23, 24, 25]
    rs = members(tok, seeds, PruneRule(at=AT, keep=3, size=5), limits={4: 1})
    engine_with_head(model, tok, head=head).generate(rs)
    prompt = tok.encode(PROMPT)
    for r in rs:
        d = r.control["arrol"]
        k = d["at"]
        assert k == (AT if r.index_in_group < 4 else 0)  # member 4 ended at its first token
        h = hidden_of(model, prompt + r.response_tokens[:k] + [0])[len(prompt) + k - 1]
        lp = torch.tensor([prefix_confidence(r.logprobs[len(prompt):len(prompt) + k])])
        assert d["p"] == pytest.approx(float(head.predict(h[None], torch.tensor([k]), lp)[0]),
                                       abs=p_atol)
    # the trainer's features of the finished samples are these hidden states too
    done = [r for r in rs if r.finish != "pruned"]
    h, k, lp = prefix_hidden(model, done, AT, tok.pad_token_id, device)
    p = head.predict(h.cpu(), k.cpu(), lp.cpu()).tolist()
    assert p == pytest.approx([r.control["arrol"]["p"] for r in done], abs=p_atol)
    monkeypatch.setattr(arrol, "split_head", lambda m: None)  # a model it cannot split
    h2, k2, lp2 = prefix_hidden(model, done, AT, tok.pad_token_id, device)
    # the same decoder on the same padded batch, read at its output either way: the same
    # kernels on the same shapes, so bit for bit on any CPU
    assert torch.equal(h2, h) and torch.equal(k2, k) and torch.equal(lp2, lp)


def test_an_interrupted_group_decides_the_same_in_its_re_prefill(lm):
    model, tok = lm
    width = model.get_output_embeddings().in_features
    head = QualityHead(width, AT, hidden=8, seed=5)
    with torch.no_grad():
        head.net[2].weight.normal_(0, 3.0, generator=torch.Generator().manual_seed(2))
    seeds = [31, 32, 33, 34, 35, 36]
    rule = PruneRule(at=AT, keep=3, size=6)
    whole = members(tok, seeds, rule)
    engine_with_head(model, tok, head=head).generate(whole)
    parts = members(tok, seeds, rule)
    e = engine_with_head(model, tok, head=head)
    e.add(parts)
    e.step()  # prefill samples token 1, a decode token 2
    e.step()  # token 3: every member holds AT tokens, the checkpoint is the next forward
    assert all(r.response_len == AT for r in e.sync())
    e.abort()
    e.add(parts)  # resumed: re-prefilled with their 3 tokens, the checkpoint is in there
    while e.pending():
        e.step()
    assert [r.finish for r in parts] == [r.finish for r in whole]
    assert [r.response_tokens for r in parts] == [r.response_tokens for r in whole]
    # the resume re-prefilled the checkpoint's tokens where the whole run decoded them:
    # other kernel shapes, p within the model's reordering bound at scale 1 (see above)
    assert [r.control["arrol"]["p"] for r in parts] == pytest.approx(
        [r.control["arrol"]["p"] for r in whole], abs=forward_atol(model, 1.0))
    assert e.stats()["prefill_forwards"] == 2  # the resume's, none for pruning


def test_a_group_that_does_not_fit_waits_and_is_admitted_whole(lm):
    model, tok = lm
    rule = PruneRule(at=AT, keep=3, size=5)
    a = members(tok, range(50, 55), rule, gid="a")
    b = members(tok, range(60, 65), rule, gid="b")
    e = engine_with_head(model, tok, warm=False, max_batch=7)
    e.generate(a + b)
    for g in (a, b):  # one prefill per group, every pruned member cut at the checkpoint
        assert len({r.timings["engine_prefill"] for r in g}) == 1
        assert sum(r.finish == "pruned" for r in g) == 2
        assert all(r.response_len == AT for r in g if r.finish == "pruned")
    assert b[0].timings["engine_prefill"] > a[0].timings["engine_prefill"]
    with pytest.raises(ValueError, match="must decode together"):
        e.add(members(tok, range(8), PruneRule(at=AT, keep=3, size=8), gid="c"))
    with pytest.raises(ValueError, match="no quality head"):
        TorchEngine(model, tok).add(members(tok, [1], PruneRule(at=AT, keep=1, size=1)))


def test_a_loaded_head_leaves_requests_without_a_rule_bitwise_alone(lm):
    model, tok = lm
    plain, other = members(tok, range(70, 76)), members(tok, range(70, 76))
    TorchEngine(model, tok, max_batch=8).generate(plain)
    engine_with_head(model, tok).generate(other)
    assert [r.tokens for r in plain] == [r.tokens for r in other]
    assert [r.logprobs for r in plain] == [r.logprobs for r in other]
