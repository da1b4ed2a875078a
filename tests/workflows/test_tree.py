"""The tree workflow (rollout.workflow = "tree"): the shape of the trees, a group whose members
share prefixes through engine forks, the config checks, and a tiny training run."""

import pytest
from tree_helpers import run_tree, tree_group

from reroll.config import ConfigError
from reroll.config_checks import load_checked
from reroll.methods.latr import tree_parent


def test_tree_shape_by_hand():
    # w = 2, d = (2, 4): leaves 0..3 of tree 0 have digits 00, 01, 10, 11
    assert [tree_parent(i, (2, 4), 2) for i in range(4)] == [None, (0, 4), (0, 2), (2, 4)]
    # leaves 4..7 are tree 1, the same shape shifted by 4; 8 starts tree 2
    assert [tree_parent(i, (2, 4), 2) for i in range(4, 9)] == [None, (4, 4), (4, 2),
                                                                (6, 4), None]
    # w = 4, one position: 0 is the root, 1..3 fork from it
    assert [tree_parent(i, (3,), 4) for i in range(5)] == [None, (0, 3), (0, 3), (0, 3), None]


def test_a_tree_group_shares_prefixes_through_forks(tiny):
    model, tok = tiny
    g = tree_group(tok, 8)
    s = run_tree(model, tok, g, tree_branch_at=(1, 3), tree_width=2)
    P, rs = g.rollouts[0].prompt_len, g.rollouts
    assert all(r.finished and r.reward == 1.0 and r.response_len == 6 for r in rs)
    for i, r in enumerate(rs):
        spec = tree_parent(i, (1, 3), 2)
        if spec is None:
            assert r.parent_id is None and r.control["tree"]["parent"] is None
            continue
        parent, depth = rs[spec[0]], spec[1]
        assert r.parent_id == parent.sample_id and r.prefix_len == P + depth
        assert r.tokens[:P + depth] == parent.tokens[:P + depth]
        assert r.control["tree"] == {"parent": spec[0], "credit": "leaves", "shared": P + depth}
    # two trees of 4 leaves: per tree 6 (root) + 5 (fork at 1) + 3 + 3 (forks at 3) = 17
    # generated tokens instead of 4 x 6 = 24
    assert s["tokens_generated"] == 2 * 17
    assert s["fork_children"] == 6 and s["fork_children_prefilled"] == 0
    assert s["prefill_tokens"] == P  # one prompt, prefilled once for the two roots


def test_tree_config_checks():
    ok = load_checked(None, ["rollout.workflow=tree", "rollout.tree_branch_at=[2, 4]"])
    assert ok.rollout.tree_width == 2 and ok.rollout.policy_token_limit == 8
    bad = [(["rollout.workflow=tree"], "list of response positions"),
           (["rollout.workflow=tree", "rollout.tree_branch_at=[4, 2]"], "strictly ascending"),
           (["rollout.workflow=tree", "rollout.tree_branch_at=[8]"], "max_new_tokens = 8"),
           (["rollout.workflow=tree", "rollout.tree_branch_at=[2]", "rollout.tree_width=1"],
            "tree_width must be >= 2"),
           (["rollout.tree_branch_at=[2]"], "workflow = \"tree\" only"),
           (["rollout.workflow=tree", "rollout.tree_branch_at=[2]", "engine.name=openai",
             "engine.base_url=http://127.0.0.1:9"], "engine that forks")]
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message):
            load_checked(None, overrides)


def test_a_tiny_tree_run_trains_on_the_leaves(small_run, tmp_path):
    from reroll.recording.store import RolloutStore
    from reroll.runtime import train

    cfg = small_run(tmp_path / "tree", "rollout.workflow=tree", "rollout.tree_branch_at=[1]",
                    "train.steps=2")
    result = train(cfg, progress=False)
    groups = [g for _, g in RolloutStore(tmp_path / "tree" / "rollouts").groups()]
    assert len(groups) == 8  # 2 steps x 4 groups
    inherited = 0
    for g in groups:  # groups of 4 = 2 trees of 2 leaves: members 1 and 3 fork at 1 token
        a, b, c, d = g.rollouts
        assert a.parent_id is None and c.parent_id is None
        assert b.parent_id == a.sample_id and d.parent_id == c.sample_id
        for kid in (b, d):
            assert kid.prefix_len == kid.prompt_len + 1 and kid.loss_mask[kid.prompt_len]
            assert [s.source for s in kid.spans][:2] == ["prompt", "inherited"]
            inherited += 1
    # every trained response token was generated once, except the inherited ones
    total = sum(r.response_len for g in groups for r in g.rollouts)
    assert result["pipeline/tokens_generated"] == total - inherited
