"""Forking a running sequence (reroll.engine.fork, TorchEngine.fork, EngineService.fork):
children share the parent's cached prefix, sample with their own seeds, and equal independent
requests that re-prefill that prefix."""

import asyncio

from engine_helpers import make

from reroll.engine.fork import Fork, ForkTable, inherit
from reroll.engine.service import EngineService
from reroll.engine.torch_engine import TorchEngine
from reroll.rollout import Span

PROMPT = "12+34="


def _run(engine: TorchEngine) -> None:
    while engine.pending():
        engine.step()


def test_children_equal_independent_requests_that_reprefill_the_prefix(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=16)
    parent = make(tok, PROMPT, max_new_tokens=12, seed=5)
    P = parent.prompt_len  # 6
    at = P + 3  # the children inherit 3 response tokens
    kids = [make(tok, PROMPT, max_new_tokens=12, seed=100 + i) for i in range(4)]
    eng.add([parent])
    eng.fork(parent, kids, at)
    _run(eng)
    s = eng.stats()
    # only the parent's prompt went through a prefill; the children's 8 shared positions
    # (the 9th, the parent's token 8, is fed by each child's first decode) were copied
    assert s["prefill_tokens"] == P and s["prefill_forwards"] == 1
    assert s["fork_children"] == 4 and s["fork_tokens_shared"] == 4 * (at - 1)
    assert s["fork_children_prefilled"] == 0
    # decode rows: parent 11 (12 tokens, the first from the prefill) + children 4 x 9
    assert s["decode_rows"] == 11 + 4 * 9

    refs = [make(tok, PROMPT, max_new_tokens=12, seed=100 + i) for i in range(4)]
    for r in refs:  # the prefix as a resumed record: prompt + the parent's first 3 tokens
        inherit(r, parent, at)
    ref_eng = TorchEngine(model, tok, max_batch=16)
    ref_eng.generate(refs)
    assert ref_eng.stats()["prefill_tokens"] == at  # 4 identical sequences, prefilled once
    for k, r in zip(kids, refs, strict=True):
        assert k.tokens == r.tokens and len(k.tokens) == P + 12
        # not bitwise: the fork's prefix keys/values were computed by decode steps (one
        # token per forward, batched with the parent), the reference's by one packed
        # prefill; float32 matmuls of other shapes round differently (seen: <= 4.3e-6)
        assert max(abs(a - b) for a, b in zip(k.logprobs, r.logprobs, strict=True)) < 1e-5
        assert k.parent_id == parent.sample_id and k.prefix_len == at
        assert k.logprobs[:at] == parent.logprobs[:at] and k.versions == [-1] * P + [0] * 12
        assert k.spans == [Span(0, P, "prompt"), Span(P, at, "inherited", 0),
                           Span(at, P + 12, "sampled", 0)]
        assert k.loss_mask == [False] * P + [True] * 12 and k.finish == "length"


def test_a_child_with_the_parents_seed_repeats_the_parent_bit_for_bit(lm):
    """The copied cache rows are the parent's own: same rows, same fed token, same
    counter-based uniforms give the same tokens and log-probs exactly."""
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=8)
    parent = make(tok, PROMPT, max_new_tokens=10, seed=9)
    twin = make(tok, PROMPT, max_new_tokens=10, seed=9)
    other = make(tok, PROMPT, max_new_tokens=10, seed=10)
    eng.add([parent])
    eng.fork(parent, [twin, other], parent.prompt_len + 4)
    _run(eng)
    assert twin.tokens == parent.tokens and twin.logprobs == parent.logprobs
    assert other.tokens[:parent.prompt_len + 4] == parent.tokens[:parent.prompt_len + 4]


def test_fork_of_a_running_parent_past_the_point_happens_at_once(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=8)
    parent = make(tok, PROMPT, max_new_tokens=10, seed=1)
    eng.add([parent])
    for _ in range(4):  # the prefill samples token 1, three decodes tokens 2-4
        eng.step()
    kid = make(tok, PROMPT, max_new_tokens=10, seed=2)
    eng.fork(parent, [kid], parent.prompt_len + 2)
    assert eng.stats()["fork_children"] == 1 and kid.prefix_len == parent.prompt_len + 2
    _run(eng)
    assert kid.tokens[:kid.prefix_len] == parent.tokens[:kid.prefix_len]
    assert kid.finish == "length" and kid.response_len == 10


def test_fallbacks_reprefill_the_prefix_with_the_same_tokens(lm):
    """A finished parent (its cache is gone) and a full engine (no free slot) give children
    that re-prefill the prefix; they sample what a shared-cache child samples."""
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=8)
    parent = make(tok, PROMPT, max_new_tokens=8, seed=3)
    shared = make(tok, PROMPT, max_new_tokens=8, seed=4)
    eng.add([parent])
    eng.fork(parent, [shared], parent.prompt_len + 2)
    _run(eng)
    late = make(tok, PROMPT, max_new_tokens=8, seed=4)
    eng.fork(parent, [late], parent.prompt_len + 2)  # parent finished: re-prefill
    _run(eng)
    assert eng.stats()["fork_children_prefilled"] == 1
    assert late.tokens == shared.tokens

    full = TorchEngine(model, tok, max_batch=1)  # the parent holds the only slot
    p2 = make(tok, PROMPT, max_new_tokens=8, seed=3)
    queued = make(tok, PROMPT, max_new_tokens=8, seed=4)
    full.add([p2])
    full.fork(p2, [queued], p2.prompt_len + 2)
    _run(full)
    assert full.stats()["fork_children_prefilled"] == 1 and full.stats()["fork_children"] == 0
    assert queued.tokens == shared.tokens and queued.resume_count == 0


def test_a_parent_that_stops_early_forks_before_its_last_token(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=8)
    probe = make(tok, PROMPT, max_new_tokens=8, seed=6)
    eng.generate([probe])
    stop = probe.tokens[probe.prompt_len + 2]  # make the parent stop at its 3rd token
    parent = make(tok, PROMPT, max_new_tokens=8, seed=6, stop_token_ids=[stop])
    kid = make(tok, PROMPT, max_new_tokens=8, seed=7, stop_token_ids=[stop])
    eng.add([parent])
    eng.fork(parent, [kid], parent.prompt_len + 6)
    _run(eng)
    first = probe.tokens[probe.prompt_len:].index(stop)  # <= 2
    assert parent.finish == "stop" and parent.response_len == first + 1
    assert kid.prefix_len == len(parent.tokens) - 1  # the stop token is drawn again


def test_grandchildren_fork_from_a_child_that_is_still_waiting(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=8)
    root = make(tok, PROMPT, max_new_tokens=8, seed=1)
    kid = make(tok, PROMPT, max_new_tokens=8, seed=2)
    grand = make(tok, PROMPT, max_new_tokens=8, seed=3)
    P = root.prompt_len
    eng.add([root])
    eng.fork(root, [kid], P + 2)
    eng.fork(kid, [grand], P + 5)
    _run(eng)
    assert grand.parent_id == kid.sample_id and grand.prefix_len == P + 5
    assert grand.tokens[:P + 5] == kid.tokens[:P + 5]
    assert grand.tokens[:P + 2] == root.tokens[:P + 2]
    assert eng.stats()["fork_children"] == 2 and eng.stats()["prefill_tokens"] == P


def test_service_fork_and_abort_of_the_parent_for_good(lm):
    model, tok = lm

    async def main():
        svc = EngineService(TorchEngine(model, tok, max_batch=8))
        parent = make(tok, PROMPT, max_new_tokens=6, seed=1)
        kids = [make(tok, PROMPT, max_new_tokens=6, seed=2 + i) for i in range(2)]
        done = svc.generate(parent)
        futs = svc.fork(parent, kids, parent.prompt_len + 3)
        await asyncio.gather(done, *futs)
        assert all(k.prefix_len == parent.prompt_len + 3 and k.finish == "length" for k in kids)
        # a parent stopped for good takes its waiting children with it
        p2 = make(tok, PROMPT, max_new_tokens=30, seed=1)
        k2 = make(tok, PROMPT, max_new_tokens=30, seed=2)
        f = svc.generate(p2)
        (fk,) = svc.fork(p2, [k2], p2.prompt_len + 25)
        await asyncio.sleep(0)
        await svc.abort([p2.sample_id])
        await asyncio.gather(f, fk)
        assert p2.finish == "abort" and k2.finish == "abort" and k2.tokens == p2.prompt_tokens
        await svc.close()

    asyncio.run(main())


def test_fork_table_points_and_drops():
    class C:
        def __init__(self, i):
            self.sample_id = i

    c1, c2, c3 = C("c1"), C("c2"), C("c3")
    t = ForkTable()
    t.add(Fork("p", [c1], 9))
    t.add(Fork("p", [c2], 7))
    got = t.due("p", 8, finished=False)  # length 8: the fork at 7 is due, 9 waits
    assert [(f.children, at) for f, at in got] == [([c2], 7)]
    got = t.due("p", 8, finished=True)  # finished at length 8: at min(9, 8 - 1) = 7
    assert [(f.children, at) for f, at in got] == [([c1], 7)] and not t
    t.add(Fork("p", [c1, c2], 7))
    t.add(Fork("c2", [c3], 12))
    assert t.drop({"p"}) == [c1, c2, c3] and not t  # the grandchild goes with its parent
