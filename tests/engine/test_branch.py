"""Branching at high-probability alternatives (LATR, reroll.engine.branch, TorchEngine.branch,
EngineService.branch): the rule by hand, children equal to independent requests that
re-prefill the parent's prefix plus the forced token, the fallbacks, greedy and spare-less
requests unchanged, interrupts that keep the trees, and the records' round trips."""

import asyncio

import torch
from engine_helpers import full_logprobs, make

from reroll.engine.branch import branch_tokens
from reroll.engine.fork import inherit
from reroll.engine.service import EngineService
from reroll.engine.torch_engine import TorchEngine
from reroll.recording.store import from_table, to_table
from reroll.rollout import BranchRule, Example, Group, Rollout, Span

PROMPT = "12+34="
# Top-2 probabilities along this model's response to PROMPT with seed 5 (the first three
# positions): (0.074, 0.069), (0.080, 0.049), (0.069, 0.054). With tau_abs = 0.04 and tau_rel
# = 0.05 the rule fires at each (0.069 > 0.04 and 0.005 < 0.05; 0.049, 0.031; 0.054, 0.015).
RULE = BranchRule(tau_abs=0.04, tau_rel=0.05)


def _run(engine: TorchEngine) -> None:
    while engine.pending():
        engine.step()


def test_the_rule_by_hand(device):
    rows = [  # probabilities (padded with zeros to 7 tokens), sampled token, thresholds
        ([0.40, 0.30, 0.20, 0.10], 0, 0.15, 0.25),  # fires: 0.30 > 0.15, 0.10 < 0.25
        ([0.40, 0.30, 0.20, 0.10], 1, 0.15, 0.25),  # the parent took j: the child takes top
        ([0.40, 0.30, 0.20, 0.10], 2, 0.15, 0.25),  # neither: the child takes j
        ([0.155, 0.151, 0.14, 0.14, 0.14, 0.137, 0.137], 0, 0.15, 0.25),  # 0.151 > 0.15
        ([0.155, 0.149, 0.14, 0.14, 0.14, 0.138, 0.138], 0, 0.15, 0.25),  # 0.149 <= 0.15
        ([0.55, 0.31, 0.14], 0, 0.15, 0.25),  # gap 0.24 < 0.25
        ([0.56, 0.30, 0.14], 0, 0.15, 0.25),  # gap 0.26 >= 0.25
        ([0.14, 0.31, 0.55], 2, 0.15, 0.25),  # top is token 2, j token 1: sampled top -> 1
        ([0.14, 0.31, 0.55], 1, 0.15, 0.25),  # sampled j -> 2
        ([0.14, 0.31, 0.55], 0, 0.15, 0.25),  # sampled neither -> j = 1
        ([0.40, 0.30, 0.20, 0.10], 0, 0.35, 0.25),  # a stricter tau_abs on this row: 0.30
    ]
    z = dict(device=device)  # the engine applies the rule on the model's device
    probs = torch.tensor([p + [0.0] * (7 - len(p)) for p, *_ in rows], **z)
    args = (probs.log(), torch.tensor([s for _, s, _, _ in rows], **z),
            torch.tensor([a for *_, a, _ in rows], **z), torch.tensor([r for *_, r in rows], **z))
    # parent "sampled": the row keeps its token, the child takes the other candidate
    child, own = branch_tokens(*args)
    assert child.tolist() == [1, 0, 1, 1, -1, 1, -1, 1, 2, 1, -1]
    assert own.tolist() == [s for _, s, _, _ in rows]
    # parent "argmax" (LATR): where it fires the row takes top, the child j, whatever was
    # sampled; where it does not the row keeps its token
    child, own = branch_tokens(*args, torch.ones(len(rows), dtype=torch.bool, **z))
    assert child.tolist() == [1, 1, 1, 1, -1, 1, -1, 1, 1, 1, -1]
    assert own.tolist() == [0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 0]


def _grow(model, tok, n_spares: int, max_batch: int = 16, run: bool = True):
    """(engine, root, spares): a seeded root of PROMPT carrying RULE, branched with
    ``n_spares`` seeded spares in a fresh engine, run to the end unless ``run`` is False."""
    eng = TorchEngine(model, tok, max_batch=max_batch)
    root = make(tok, PROMPT, max_new_tokens=12, seed=5, branch_rule=RULE)
    spares = [make(tok, PROMPT, max_new_tokens=12, seed=100 + i, branch_rule=RULE)
              for i in range(n_spares)]
    eng.branch(root, spares)
    if run:
        _run(eng)
    return eng, root, spares


def _reference(model, tok, child: Rollout, parent: Rollout) -> Rollout:
    """The child as an independent request: the parent's prefix and the forced token as a
    resumed record, re-prefilled, with the child's seed."""
    t = child.prefix_len
    ref = make(tok, PROMPT, max_new_tokens=12, seed=child.sampling.seed)
    inherit(ref, parent, t)
    ref.append(child.tokens[t], child.logprobs[t], 0, "forced")
    TorchEngine(model, tok, max_batch=4).generate([ref])
    return ref


def test_children_equal_independent_requests_of_the_prefix_and_forced_token(lm):
    model, tok = lm
    eng, root, spares = _grow(model, tok, 3)
    P = root.prompt_len  # 6
    # all three spares branch off the root (slot 0 comes first) at response positions 0, 1, 2
    assert [(c.parent_id, c.prefix_len) for c in spares] == [
        (root.sample_id, P), (root.sample_id, P + 1), (root.sample_id, P + 2)]
    s = eng.stats()
    # only the prompt went through a forward; the children copied the root's cache rows.
    # Root: 12 tokens (1 from the prefill, 11 decode rows); a child forced at position a
    # samples positions a+1..11: 11 - a decode rows -> 11 + 11 + 10 + 9 = 41 rows, 42 tokens
    assert s["prefill_tokens"] == P and s["prefill_forwards"] == 1
    assert s["decode_rows"] == 41 and s["tokens_generated"] == 42
    assert s["branch_children"] == 3 and s["branch_children_prefilled"] == 0
    assert s["branch_spares_independent"] == 0
    for c in spares:
        t = c.prefix_len
        assert c.tokens[:t] == root.tokens[:t] and c.tokens[t] != root.tokens[t]
        # the forced token is the top-2 candidate the root did not sample, with its log-prob
        # under the distribution the root sampled from (temperature 1: the full softmax)
        ids = torch.tensor([root.tokens[:t]], device=model.device)
        logp = torch.log_softmax(model(input_ids=ids).logits[0, -1].float().detach(), -1)
        top2 = logp.topk(2).indices.tolist()
        assert c.tokens[t] == (top2[0] if root.tokens[t] == top2[1] else top2[1])
        assert abs(c.logprobs[t] - float(full_logprobs(model, c.tokens[:t + 1])[-1])) < 1e-5
        want = [Span(0, P, "prompt")] + ([Span(P, t, "inherited", 0)] if t > P else [])
        assert c.spans == want + [Span(t, t + 1, "forced", 0), Span(t + 1, P + 12, "sampled", 0)]
        assert c.loss_mask == [False] * P + [True] * 12 and c.versions == [-1] * P + [0] * 12
        ref = _reference(model, tok, c, root)
        assert c.tokens == ref.tokens and c.spans == ref.spans and c.finish == ref.finish
        # not bitwise: the prefix's keys/values came from decode steps here, from one packed
        # prefill in the reference (other kernel shapes round differently)
        assert max(abs(a - b) for a, b in zip(c.logprobs, ref.logprobs, strict=True)) < 1e-5


def test_with_no_free_slot_children_reprefill_and_sample_the_same(lm):
    model, tok = lm
    _, root, spares = _grow(model, tok, 3)
    full, root2, spares2 = _grow(model, tok, 3, max_batch=1)  # the root holds the only slot
    s = full.stats()
    assert s["branch_children"] == 3 and s["branch_children_prefilled"] == 3
    # each child re-prefills its prefix and forced token: 6 + (6+1) + (6+2) + (6+3) = 30
    assert s["prefill_tokens"] == 30
    assert root2.tokens == root.tokens
    for a, b in zip(spares, spares2, strict=True):
        assert a.tokens == b.tokens and a.spans == b.spans and b.resume_count == 0
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5


def test_greedy_and_spareless_requests_never_branch_and_unused_spares_run_alone(lm):
    model, tok = lm
    eng = TorchEngine(model, tok, max_batch=16)
    root = make(tok, PROMPT, max_new_tokens=12, temperature=0.0, branch_rule=RULE)
    spares = [make(tok, PROMPT, max_new_tokens=12, seed=100 + i, branch_rule=RULE)
              for i in range(3)]
    eng.branch(root, spares)
    _run(eng)
    s = eng.stats()
    assert s["branch_children"] == 0 and s["branch_spares_independent"] == 3
    refs = [make(tok, PROMPT, max_new_tokens=12, seed=100 + i) for i in range(3)]
    TorchEngine(model, tok, max_batch=16).generate(refs)  # the 3 together, as the spares ran
    for a, b in zip(spares, refs, strict=True):
        assert a.parent_id is None and a.tokens == b.tokens and a.logprobs == b.logprobs
    # a request that carries the rule but has no spares: bitwise the request without it
    lone = make(tok, PROMPT, max_new_tokens=12, seed=5, branch_rule=RULE)
    plain = make(tok, PROMPT, max_new_tokens=12, seed=5)
    TorchEngine(model, tok, max_batch=4).generate([lone])
    TorchEngine(model, tok, max_batch=4).generate([plain])
    assert lone.tokens == plain.tokens and lone.logprobs == plain.logprobs
    assert lone.spans == plain.spans


def test_an_interrupt_keeps_the_tree_and_its_spares(lm):
    model, tok = lm
    _, root, spares = _grow(model, tok, 3)
    eng, root2, spares2 = _grow(model, tok, 3, run=False)
    eng.step()  # root samples positions 0 and 1 and spawns a child at each
    assert eng.stats()["branch_children"] == 2
    aborted = eng.abort()  # what EngineService.update_weights does, then it adds them again
    assert {r.sample_id for r in aborted} == {root2.sample_id} | {c.sample_id
                                                                 for c in spares2[:2]}
    eng.add(aborted)
    _run(eng)
    s = eng.stats()
    assert s["branch_children"] == 3 and s["branch_spares_independent"] == 0
    assert root2.resume_count == 1 and spares2[2].resume_count == 0
    for a, b in zip([root, *spares], [root2, *spares2], strict=True):
        assert a.tokens == b.tokens and a.prefix_len == b.prefix_len
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-5


def test_service_branch_and_aborts(lm):
    model, tok = lm
    never = BranchRule(tau_abs=0.99, tau_rel=0.01)

    async def main():
        svc = EngineService(TorchEngine(model, tok, max_batch=8))
        root = make(tok, PROMPT, max_new_tokens=30, seed=1, branch_rule=never)
        spares = [make(tok, PROMPT, max_new_tokens=4, seed=2 + i) for i in range(2)]
        futs = svc.branch(root, spares)
        await asyncio.sleep(0)
        await svc.abort([root.sample_id])  # the root stops for good: its spares run alone
        got = await asyncio.gather(*futs)
        assert got == [root, *spares] and root.finish == "abort"
        assert [(s.finish, s.parent_id, s.response_len) for s in spares] == [
            ("length", None, 4)] * 2
        # everything stopped: the spares waiting in the engine's tree stop too
        root2 = make(tok, PROMPT, max_new_tokens=30, seed=1, branch_rule=never)
        spares2 = [make(tok, PROMPT, max_new_tokens=4, seed=2 + i) for i in range(2)]
        futs = svc.branch(root2, spares2)
        for _ in range(3):
            await asyncio.sleep(0)
        await svc.abort()
        await asyncio.gather(*futs)
        assert [r.finish for r in (root2, *spares2)] == ["abort"] * 3
        assert [s.response_len for s in spares2] == [0, 0]
        await svc.close()

    asyncio.run(main())


def test_a_branched_record_round_trips_through_json_and_the_store(lm):
    model, tok = lm
    _, root, spares = _grow(model, tok, 2)
    child = spares[1]
    assert any(s.source == "forced" for s in child.spans)
    assert Rollout.from_json(child.to_json()).to_dict() == child.to_dict()
    g = Group("g", Example("p", PROMPT, "46"), 3, rollouts=[root, *spares])
    ((step, back),) = list(from_table(to_table(7, [g])))
    assert step == 7 and back.to_dict() == g.to_dict()
    assert back.rollouts[2].sampling.branch_rule == RULE


def test_a_trees_shape_does_not_depend_on_the_requests_beside_it(lm):
    """Rows of one tree that fire in the same step take its spares by their rank in the tree
    (root first, then by spawn), not by slot: unrelated requests that finish and move the
    tree's rows between slots leave its shape and tokens as they are alone."""
    model, tok = lm

    def tree(others_lens):
        eng = TorchEngine(model, tok, max_batch=16)
        if others_lens:
            eng.add([make(tok, "7+8=", gid=f"o{i}", max_new_tokens=n, seed=50 + i)
                     for i, n in enumerate(others_lens)])
            eng.step()  # the others take the first slots
        root = make(tok, PROMPT, max_new_tokens=12, seed=5, branch_rule=RULE)
        spares = [make(tok, PROMPT, max_new_tokens=12, seed=100 + i, branch_rule=RULE)
                  for i in range(5)]
        eng.branch(root, spares)
        _run(eng)
        ids = {r.sample_id: k for k, r in enumerate([root, *spares])}
        return ([(ids.get(c.parent_id), c.prefix_len) for c in spares],
                [c.tokens for c in [root, *spares]])

    alone = tree([])
    assert sum(p is not None for p, _ in alone[0]) >= 3  # several members fired
    for lens in ([2], [1, 1], [3, 1, 2], [2, 4, 1, 3]):
        assert tree(lens) == alone, lens


def test_latrs_argmax_parent_takes_the_top_token_and_the_child_the_second(lm):
    """LATR's rule (BranchRule.parent "argmax", the default): at each branch point the root
    takes the most likely token and the child the second, both spans "forced" with their
    log-probs under the distribution the root sampled from (what the trainer's behaviour
    log-prob must be: at staleness 0 their importance ratio is 1, as for a sampled token).
    Under parent "sampled" the root keeps its own token."""
    model, tok = lm
    runs = {}
    for parent in ("argmax", "sampled"):
        rule = BranchRule(tau_abs=0.04, tau_rel=0.05, parent=parent)
        eng = TorchEngine(model, tok, max_batch=16)
        root = make(tok, PROMPT, max_new_tokens=12, seed=5, branch_rule=rule)
        spares = [make(tok, PROMPT, max_new_tokens=12, seed=100 + i, branch_rule=rule)
                  for i in range(3)]
        eng.branch(root, spares)
        _run(eng)
        runs[parent] = root, spares
    root, spares = runs["argmax"]
    sampled_root, _ = runs["sampled"]
    swapped = 0
    for c in spares:
        t = c.prefix_len
        assert c.parent_id == root.sample_id and c.tokens[:t] == root.tokens[:t]
        logp = full_logprobs(model, root.tokens[:t + 1])
        with torch.no_grad():
            ids = torch.tensor([root.tokens[:t]], device=model.device)
            top2 = model(input_ids=ids).logits[0, -1].float().topk(2).indices.tolist()
        assert (root.tokens[t], c.tokens[t]) == (top2[0], top2[1])
        assert abs(root.logprobs[t] - float(logp[-1])) < 1e-5  # log p(top), not a sample's
        if sampled_root.tokens[:t] == root.tokens[:t] and sampled_root.tokens[t] != top2[0]:
            swapped += 1  # the root had sampled another token here: its top is forced
            assert any(s.source == "forced" and s.start == t for s in root.spans)
    assert swapped >= 1  # the replacement happened at least once on this model and seed
    assert sampled_root.tokens != root.tokens
