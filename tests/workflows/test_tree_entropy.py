"""The tree workflow's "entropy" mode (LATR's branching rule, reroll.methods.latr):
groups keep n members whether the rule fires or not, spares it leaves are sampled alone, a
run repeats exactly, the "positions" mode is unchanged, a restored tree goes on without
re-attaching its spares, and tiny training runs (records, metrics, resume, asynchronous)."""

import asyncio

import pytest
import torch
from safetensors.torch import load_file
from tree_helpers import run_tree, tree_group

from reroll.config import ConfigError
from reroll.config_checks import load_checked
from reroll.engine import EngineService, TorchEngine
from reroll.methods.latr import grown, tree_parent, tree_share
from reroll.rollout import Rollout, Span, grow_group
from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train
from reroll.workflows.tree_options import TreeOptions

ALWAYS = {"tree_tau_abs": 0.0, "tree_tau_rel": 1.0}  # any second candidate, any gap: fires


def _source_at(r, t):
    return next(s.source for s in r.spans if s.start <= t < s.end)


def _records(g):
    return [(r.tokens, r.logprobs, r.spans, r.control["tree"], r.parent_id is not None)
            for r in g.rollouts]


def test_unused_spares_are_sampled_alone_and_the_group_keeps_n_members(tiny):
    model, tok = tiny
    g = tree_group(tok)
    # the random model's probabilities are about 1 / vocabulary: LATR's 0.15 never fires
    s = run_tree(*tiny, g, tree_branch="entropy", tree_width=4)
    assert len(g.rollouts) == 8 and all(r.finished and r.reward == 1.0 for r in g.rollouts)
    assert s["branch_children"] == 0 and s["branch_spares_independent"] == 6
    assert [r.control["tree"]["role"] for r in g.rollouts] == ["root", "spare", "spare",
                                                              "spare"] * 2
    refs = tree_group(tok)  # the same seeds as 8 independent requests
    TorchEngine(model, tok, max_batch=16).generate(refs.rollouts)
    for r, ref in zip(g.rollouts, refs.rollouts, strict=True):
        assert r.tokens == ref.tokens and r.parent_id is None
        assert r.control["tree"] == {"mode": "entropy", "role": r.control["tree"]["role"],
                                     "parent": None, "at": None, "credit": "leaves",
                                     "shared": 0}


def test_a_rule_that_always_fires_spends_every_spare_in_slot_order(tiny):
    """Under tree_parent "sampled" (members keep their sampled tokens): only a branch's own
    first token is forced."""
    _, tok = tiny
    g = tree_group(tok)
    s = run_tree(*tiny, g, tree_branch="entropy", tree_width=4, tree_parent="sampled",
                 **ALWAYS)
    assert len(g.rollouts) == 8 and all(r.finished and r.reward == 1.0 for r in g.rollouts)
    # per tree: the root's first token spawns member 1 (at 0); the next decode step, in slot
    # order, the root spawns member 2 and member 1 spawns member 3 (both at 1)
    want = [(None, None), (0, 0), (0, 1), (1, 1)]
    got = [(r.control["tree"]["parent"], r.control["tree"]["at"]) for r in g.rollouts]
    assert got == want + [(None if p is None else p + 4, a) for p, a in want]
    P = g.rollouts[0].prompt_len
    for r in g.rollouts:
        if r.control["tree"]["role"] != "branch":
            continue
        parent, t = g.rollouts[r.control["tree"]["parent"]], r.prefix_len
        assert r.parent_id == parent.sample_id and r.tokens[:t] == parent.tokens[:t]
        assert r.tokens[t] != parent.tokens[t] and r.control["tree"]["shared"] == t
        assert _source_at(r, t) == "forced" and r.response_len == 6
    # member 3 inherits member 1's forced token (inherited there) and adds its own next to it
    assert g.rollouts[3].spans[1:3] == [Span(P, P + 1, "inherited", 0),
                                        Span(P + 1, P + 2, "forced", 0)]
    assert all(sum(s.end - s.start for s in r.spans if s.source == "forced") ==
               (r.control["tree"]["role"] == "branch") for r in g.rollouts)  # one own each
    # sampled tokens per tree: 6 (root) + 5 + 4 + 4 (the children's forced tokens are
    # chosen, not sampled) = 19, instead of 4 x 6 = 24
    assert s["tokens_generated"] == 2 * 19 and s["branch_children"] == 6
    assert s["branch_spares_independent"] == 0 and s["prefill_tokens"] == P


def test_latrs_argmax_parent_takes_the_top_token_at_every_branch_point(tiny):
    """The default tree_parent "argmax": where a member branches it takes the most likely
    token (forced where it had sampled another) and the branch the second; the draws are
    the same as under "sampled" (a forced token replaces a draw, it is not an extra one)."""
    model, tok = tiny
    g = tree_group(tok)
    s = run_tree(*tiny, g, tree_branch="entropy", tree_width=4, **ALWAYS)
    assert s["tokens_generated"] == 2 * 19 and s["branch_children"] == 6
    forced_parents = 0
    for r in g.rollouts:
        if r.control["tree"]["role"] != "branch":
            continue
        parent, t = g.rollouts[r.control["tree"]["parent"]], r.prefix_len
        with torch.no_grad():
            ids = torch.tensor([parent.tokens[:t]], device=model.device)
            top2 = model(input_ids=ids).logits[0, -1].float().topk(2).indices.tolist()
        assert (parent.tokens[t], r.tokens[t]) == (top2[0], top2[1])
        assert _source_at(r, t) == "forced" and _source_at(parent, t) in ("forced", "sampled")
        forced_parents += _source_at(parent, t) == "forced"
    assert forced_parents >= 1  # some member had sampled another token there


def test_the_tree_share_decays_linearly_and_a_share_of_0_samples_plainly(tiny):
    assert [tree_share(v, 10) for v in (-1, 0, 5, 10, 20)] == [1.0, 1.0, 0.5, 0.0, 0.0]
    assert tree_share(7, 0) == 1.0  # no decay
    _, tok = tiny
    g = tree_group(tok)
    g.start_version = 10  # at tree_mix_steps = 10: no tree is grown
    s = run_tree(*tiny, g, tree_branch="entropy", tree_width=4, tree_mix_steps=10, **ALWAYS)
    assert s["branch_children"] == 0 and len(g.rollouts) == 8
    assert [r.control["tree"]["role"] for r in g.rollouts] == ["plain"] * 8
    half = [tree_group(tok) for _ in range(40)]
    for h in half:
        h.start_version = 5
    share = sum(grown(h, b, TreeOptions(mix_steps=10)) for h in half for b in range(2)) / 80
    assert 0.3 < share < 0.7  # about half of the trees at version 5 of 10


def test_members_the_allocator_adds_to_a_started_tree_run_alone(tiny):
    _, tok = tiny
    g = tree_group(tok, 2)  # one tree of width 4 with only its root and one spare so far

    def grow(group):  # a second round of 2: members 2 and 3 join the started tree's block
        if len(group.rollouts) > 2:
            return 0
        first = group.rollouts[0]
        for r in grow_group(group, 2, first.prompt_tokens, first.sampling, 0, group_round=1):
            r.sampling.seed = 10 + r.index_in_group
        return 2

    s = run_tree(*tiny, g, tree_branch="entropy", tree_width=4, grow=grow, **ALWAYS)
    assert [(r.control["tree"]["role"], r.control["tree"]["parent"], r.group_round)
            for r in g.rollouts] == [("root", None, 0), ("branch", 0, 0), ("spare", None, 1),
                                     ("spare", None, 1)]
    assert s["branch_children"] == 1 and all(r.response_len == 6 for r in g.rollouts)


def test_a_seeded_entropy_group_repeats_exactly(tiny):
    _, tok = tiny
    a, b = tree_group(tok), tree_group(tok)
    run_tree(*tiny, a, tree_branch="entropy", tree_width=4, **ALWAYS)
    run_tree(*tiny, b, tree_branch="entropy", tree_width=4, **ALWAYS)
    assert _records(a) == _records(b)


def test_the_positions_mode_is_the_fork_calls_it_always_made(tiny):
    """"positions" (the default) is bitwise what the workflow did before "entropy" existed:
    roots through generate, every other member a fork of its parent, submitted together."""
    model, tok = tiny
    assert load_checked(None, ["rollout.workflow=tree", "rollout.tree_branch_at=[1]"]
                        ).rollout.tree_branch == "positions"
    g = tree_group(tok)
    s = run_tree(*tiny, g, tree_branch_at=(1, 3), tree_width=2)
    ref = tree_group(tok)

    async def by_hand():
        core = TorchEngine(model, tok, max_batch=16)
        engine = EngineService(core)
        futs = []
        for r in ref.rollouts:
            spec = tree_parent(r.index_in_group, (1, 3), 2)
            if spec is None:
                futs.append(engine.generate(r))
            else:
                futs += engine.fork(ref.rollouts[spec[0]], [r], r.prompt_len + spec[1])
        await asyncio.gather(*futs)
        await engine.close()
        return core.stats()

    s_ref = asyncio.run(by_hand())
    for r, x in zip(g.rollouts, ref.rollouts, strict=True):
        assert (r.tokens, r.logprobs, r.spans, r.parent_id is None) == (
            x.tokens, x.logprobs, x.spans, x.parent_id is None)
        assert r.sampling.branch_rule is None
    assert s["branch_children"] == 0 and s["tokens_generated"] == s_ref["tokens_generated"]


def _cut(r: Rollout, n: int) -> Rollout:
    """``r``'s first ``n`` tokens as a record restored mid-generation."""
    d = r.to_dict()
    for k in ("tokens", "loss_mask", "logprobs", "versions"):
        d[k] = d[k][:n]
    d["spans"] = [{**s, "end": min(s["end"], n)} for s in d["spans"] if s["start"] < n]
    d.update(finish="running", completion="", scores=[], reward=None, control={})
    return Rollout.from_dict(d)


def _fresh(r: Rollout) -> Rollout:
    return _cut(Rollout.from_dict({**r.to_dict(), "parent_id": None, "prefix_len": 0,
                                   "spans": [s for s in r.to_dict()["spans"][:1]]}),
                r.prompt_len)


def test_a_restored_tree_goes_on_without_reattaching_its_spares(tiny):
    """A checkpoint of an asynchronous run caught a tree with the root and member 1 under
    way and members 2, 3 unused: the two continue as their own requests (the same tokens as
    the uninterrupted run), the spares are sampled alone."""
    _, tok = tiny
    whole = tree_group(tok, n=4)
    run_tree(*tiny, whole, tree_branch="entropy", tree_width=4, **ALWAYS)
    root, m1, m2, m3 = whole.rollouts
    P = root.prompt_len
    g = tree_group(tok, n=4)
    g.rollouts = [_cut(root, P + 3), _cut(m1, P + 2), _fresh(m2), _fresh(m3)]
    g.rollouts[2].sampling.branch_rule = g.rollouts[3].sampling.branch_rule = None
    s = run_tree(*tiny, g, tree_branch="entropy", tree_width=4, **ALWAYS)
    assert s["branch_children"] == 0 and s["branch_spares_independent"] == 0
    a, b, c, d = g.rollouts
    assert a.tokens == root.tokens and b.tokens == m1.tokens and a.resume_count == 1
    assert [r.control["tree"]["role"] for r in g.rollouts] == ["root", "branch", "spare",
                                                              "spare"]
    assert b.control["tree"]["parent"] == 0 and b.control["tree"]["at"] == 0
    assert c.parent_id is None and c.response_len == 6 and c.tokens[:P] == root.tokens[:P]


def test_entropy_config_checks():
    ok = load_checked(None, ["rollout.workflow=tree", "rollout.tree_branch=entropy",
                             "rollout.tree_width=4", "rollout.tree_tau_abs=0.1"])
    assert (ok.rollout.tree_tau_abs, ok.rollout.tree_tau_rel) == (0.1, 0.25)
    # LATR's lookahead pruning at the reference's defaults, handed to the engine's rule
    opts = TreeOptions.from_config(ok.rollout)
    assert (opts.prune_at, opts.prune_edit, opts.prune_rouge_l, opts.prune_suffix) == (
        (20, 30, 50), 0.4, 1.0, 1.0)
    tree = ["rollout.workflow=tree"]
    bad = [(tree + ["rollout.tree_branch=lookahead"], "must be \"positions\" or \"entropy\""),
           (tree + ["rollout.tree_branch=entropy", "rollout.tree_branch_at=[1]"],
            "tree_branch_at is used by rollout.tree_branch = \"positions\" only"),
           (tree + ["rollout.tree_branch_at=[1]", "rollout.tree_tau_rel=0.5"],
            "tree_tau_rel is used by rollout.tree_branch = \"entropy\" only"),
           (["rollout.tree_tau_abs=0.3"], "tree_tau_abs is used by rollout.workflow"),
           (["rollout.tree_branch=entropy"], "tree_branch is used by rollout.workflow"),
           (tree + ["rollout.tree_branch=entropy", "rollout.tree_tau_abs=1.0"],
            "rollout.tree_tau_abs"),
           (tree + ["rollout.tree_branch=entropy", "rollout.tree_tau_rel=0"],
            "rollout.tree_tau_rel"),
           (tree + ["rollout.tree_branch=entropy", "rollout.tree_tau_abs=0.5"],
            "can never fire with rollout.tree_tau_abs = 0.5"),
           (tree + ["rollout.tree_branch=entropy", "rollout.top_k=1"],
            "can never fire with rollout.top_k = 1"),
           (tree + ["rollout.tree_branch=entropy", "rollout.temperature=0"],
            "can never fire with rollout.temperature = 0"),
           (tree + ["rollout.tree_branch=entropy", "rollout.tree_width=1"],
            "tree_width must be >= 2"),
           (["rollout.tree_prune_at=[5]"], "tree_prune_at is used by rollout.workflow"),
           (tree + ["rollout.tree_branch_at=[1]", "rollout.tree_prune_edit=0.2"],
            "tree_prune_edit is used by rollout.tree_branch = \"entropy\" only"),
           (tree + ["rollout.tree_branch=entropy", "rollout.tree_prune_at=[0, 20]"],
            "tree_prune_at: LATR's lookahead windows must be token counts >= 1"),
           (tree + ["rollout.tree_branch=entropy", "rollout.tree_prune_rouge_l=1.5"],
            "rollout.tree_prune_rouge_l"),
           (tree + ["rollout.tree_branch=entropy", "engine.name=openai",
                    "engine.base_url=http://127.0.0.1:9"], "engine that forks")]
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message):
            load_checked(None, overrides)


ENTROPY = ["rollout.workflow=tree", "rollout.tree_branch=entropy", "rollout.tree_width=2",
           "rollout.tree_tau_abs=0", "rollout.tree_tau_rel=1"]


def test_a_tiny_entropy_run_records_forced_tokens_and_how_often_the_rule_fired(small_run,
                                                                             tmp_path):
    result = train(small_run(tmp_path, *ENTROPY, "train.steps=2"), progress=False)
    groups = [g for _, g in read_rollouts(tmp_path)]
    assert len(groups) == 8 and all(len(g["rollouts"]) == 4 for g in groups)
    chosen = inherited = 0
    for g in groups:  # 2 trees of 2: the rule fires at the root's first token
        a, b, c, d = g["rollouts"]
        assert b["parent_id"] == a["sample_id"] and d["parent_id"] == c["sample_id"]
        for kid in (b, d):
            t = kid["prefix_len"]
            assert t == kid["prompt_len"] and kid["spans"][1]["source"] == "forced"
            assert kid["loss_mask"][t] and kid["sampling"]["branch_rule"]["tau_rel"] == 1.0
            chosen += 1
            inherited += t - kid["prompt_len"]
    rows = read_metrics(tmp_path)
    assert [m["tree/branched_share"] for m in rows] == [0.5, 0.5]
    assert [m["tree/spares_independent_share"] for m in rows] == [0.0, 0.0]
    total = sum(len(r["tokens"]) - r["prompt_len"] for g in groups for r in g["rollouts"])
    assert result["pipeline/tokens_generated"] == total - inherited - chosen


def test_an_entropy_run_resumes_bitwise(small_run, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(small_run(a, *ENTROPY, "train.steps=4", "ckpt_every=2"), progress=False)
    train(small_run(b, *ENTROPY, "train.steps=2", "ckpt_every=2"), progress=False)
    train(small_run(b, *ENTROPY, "train.steps=4", "ckpt_every=2"), resume=True, progress=False)

    def batches(d):
        return [(s, [(r["tokens"], r["logprobs"], r["control"]["tree"]) for r in g["rollouts"]])
                for s, g in read_rollouts(d)]

    assert batches(a) == batches(b)
    wa, wb = (load_file(str(d / "checkpoints" / "step_000004" / "model" / "model.safetensors"))
              for d in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_an_asynchronous_entropy_run_keeps_every_group_whole(small_run, tmp_path):
    train(small_run(tmp_path, *ENTROPY, "train.steps=3", "runtime.max_staleness=1"),
          progress=False)
    groups = [g for _, g in read_rollouts(tmp_path)]
    assert len(groups) == 12 and all(len(g["rollouts"]) == 4 for g in groups)
    assert all(m.get("pipeline/dropped_stale", 0) == 0 for m in read_metrics(tmp_path))


def test_segment_credit_trains_the_branching_rules_trees_once_per_token(small_run, tmp_path):
    """tree_branch = "entropy" with tree_credit = "segments": every member records the
    credit; a branch's forced token is its own first token (trained in the branch), the
    tokens it inherited are trained only in the member it branched from, so the loss holds
    exactly the tokens the members produced themselves (sampled or forced)."""
    train(small_run(tmp_path, *ENTROPY, "rollout.tree_credit=segments", "train.steps=2"),
          progress=False)
    groups = [g for _, g in read_rollouts(tmp_path)]
    recs = [r["control"]["tree"] for g in groups for r in g["rollouts"]]
    assert all(t["credit"] == "segments" and t["scale"] and t["mode"] == "entropy"
               for t in recs)
    assert any(t["role"] == "branch" for t in recs)
    own = sum(len(r["tokens"]) - r["prefix_len"] if r["parent_id"] else
              len(r["tokens"]) - r["prompt_len"] for g in groups for r in g["rollouts"])
    rows = read_metrics(tmp_path)
    assert sum(m["tree/tokens_trained"] for m in rows) == own
    # TreeRL's weight: each token counts once per root-to-leaf path through it, so the loss
    # mask sums to the tokens the leaves hold
    assert all(m["train/tokens"] == m["tree/tokens_held"] for m in rows)


@pytest.mark.parametrize("mode", ["entropy", "positions"])
def test_members_restored_finished_but_unrecorded_get_their_tree_record(tiny, mode):
    """A checkpoint's snapshot can land after the engine finished a member and before its
    workflow wrote ``control["tree"]`` (the engine's lock is released before the futures
    resolve): the restored group's finished members are recorded on resume, exactly as the
    uninterrupted run recorded them, so segment credit sees the same trees."""
    _, tok = tiny
    kw = ({"tree_branch": "entropy", "tree_width": 2, **ALWAYS} if mode == "entropy" else
          {"tree_branch_at": (1, 3), "tree_width": 2})
    whole = tree_group(tok, n=4)
    run_tree(*tiny, whole, tree_credit="segments", **kw)
    restored = type(whole).from_dict(whole.to_dict())
    for r in restored.rollouts:  # finished, unscored, unrecorded
        r.control.pop("tree")
        r.reward, r.scores = None, []
    s = run_tree(*tiny, restored, tree_credit="segments", **kw)
    assert s["tokens_generated"] == 0  # nothing generated again
    assert [r.control["tree"] for r in restored.rollouts] == \
        [r.control["tree"] for r in whole.rollouts]
    assert all(r.reward == 1.0 for r in restored.rollouts)
