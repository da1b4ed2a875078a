"""Segment credit (rollout.tree_credit = "segments", and "segments_once") through the real pipeline: the config
keys and what they refuse, the record, later-round children that re-prefill their parent's
prefix, a tiny run that trains each generated token once, a resume equal to the
uninterrupted run, and leaf credit bitwise the scalar broadcast it always was."""

import pytest
import torch
from safetensors.torch import load_file
from tree_helpers import run_tree_group

from reroll.config import ConfigError
from reroll.config_checks import load_checked
from reroll.methods.latr import tree_parent
from reroll.rollout import Score
from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train
from reroll.trainer import credit

TREE = ["rollout.workflow=tree", "rollout.tree_branch_at=[1]"]
SEGMENTS = [*TREE, "rollout.tree_credit=segments"]
TIMED = ("time", "throughput/", "engine/")  # metrics of the clock and the engine's batches


def test_the_credit_keys_and_what_segments_refuse():
    cfg = load_checked(None, SEGMENTS)
    assert cfg.rollout.tree_credit == "segments" and cfg.rollout.tree_credit_scale
    assert load_checked(None, TREE).rollout.tree_credit == "leaves"
    load_checked(None, [*SEGMENTS, "algo.surrogate=gspo_token"])  # per-token A: fine
    bad = [([*TREE, "rollout.tree_credit=nodes"], "tree_credit must be one of leaves, segments"),
           (["rollout.tree_credit=segments"], "tree_credit is used by rollout.workflow"),
           ([*TREE, "rollout.tree_credit_scale=false"], "tree_credit_scale is used by rollout"),
           ([*SEGMENTS, "algo.advantage=rloo"], "in place of algo.advantage"),
           ([*SEGMENTS, "algo.surrogate=gspo"], "algo.surrogate = 'gspo' trains one advantage"),
           ([*SEGMENTS, "replay.reuse=true"], "replay.reuse puts a banked answer"),
           ([*SEGMENTS, "preset=dr_grpo"], "advantage_args = .*norm_by_std"),
           ([*SEGMENTS, "algo.aggregation=seq_mean_token_mean"], "one token gives it a whole")]
    for overrides, message in bad:
        with pytest.raises(ConfigError, match=message):
            load_checked(None, overrides)


class ByIndex:
    """Inline scorer: reward 1 for even members, 0 for odd ones."""

    inline = True

    def combine(self, scores):
        return scores[0].value

    def score(self, rollout, example):
        return [Score("even", float(rollout.index_in_group % 2 == 0))]


def test_later_round_children_re_prefill_and_keep_the_tree_shape(tiny):
    # round 1 adds member 3, a child of member 2 (finished in round 0); every member is 5 long
    g, s = run_tree_group(*tiny, ByIndex(), 3, 5, rounds=[1], tree_branch_at=(2,),
                          tree_width=2, tree_credit="segments", tree_credit_scale=False)
    P, rs = g.rollouts[0].prompt_len, g.rollouts
    assert [r.group_round for r in rs] == [0, 0, 0, 1]
    assert s["fork_children_prefilled"] == 1  # member 3: its parent was done
    for i, r in enumerate(rs):
        spec = tree_parent(i, (2,), 2)
        shared = 0 if spec is None else P + 2
        assert r.control["tree"] == {"parent": None if spec is None else spec[0],
                                     "credit": "segments", "shared": shared, "scale": False}
        if spec is not None:
            assert r.tokens[:shared] == rs[spec[0]].tokens[:shared]
    batch_mask = torch.tensor([r.loss_mask[1:] for r in rs], dtype=torch.float32)
    rewards = torch.tensor([r.reward for r in rs])
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0]
    adv, mask, _, m = credit.token_advantages([g], rewards, torch.zeros(4), batch_mask)
    # rewards 1, 0, 1, 0: V(root) = V{0,1} = V{2,3} = 0.5, so the two shared tokens of each
    # tree get 0 and every leaf's own 3 tokens (R - .5) * 2 = +-1; members 1 and 3 train
    # their 3 sampled tokens only (columns P+1.. predict tokens P+2..). Each root's first two
    # tokens are held by 2 leaves (2 root-to-leaf paths): loss weight 2, every other 1
    for i in range(4):
        sign = 1.0 if i % 2 == 0 else -1.0
        assert adv[i].tolist() == [0.0] * (P + 1) + [sign] * 3
        first = P if i in (0, 2) else P + 2
        assert mask[i].tolist() == [0.0 if t + 1 < first else 2.0 if t + 1 < P + 2 else 1.0
                                    for t in range(P + 4)]
    assert m["tree/tokens_trained"] == s["tokens_generated"] == 5 + 3 + 5 + 3


@pytest.mark.parametrize("name", ["segments", "segments_once"])
def test_a_tiny_segments_run_trains_each_generated_token_once(small_run, tmp_path, name):
    """Each generated token is in the loss once, in the member that sampled it. Its weight:
    the root-to-leaf paths through it ("segments", TreeRL), so the loss mask sums to the
    tokens the leaves hold (every path's tokens, as the per-path batch has them), or 1
    ("segments_once"), so it sums to the tokens trained."""
    cfg = small_run(tmp_path / "seg", *TREE, f"rollout.tree_credit={name}", "train.steps=2")
    result = train(cfg, progress=False)
    groups = [g for _, g in read_rollouts(tmp_path / "seg")]
    assert len(groups) == 8 and all(
        r["control"]["tree"]["credit"] == name and r["control"]["tree"]["scale"]
        for g in groups for r in g["rollouts"])
    rows = read_metrics(tmp_path / "seg")
    # every token the engine sampled is trained once; the leaves hold more (inherited ones)
    assert sum(m["tree/tokens_trained"] for m in rows) == result["pipeline/tokens_generated"]
    assert all(m["tree/trained_share"] < 1.0 for m in rows)
    weighed = "tree/tokens_held" if name == "segments" else "tree/tokens_trained"
    assert all(m["train/tokens"] == m[weighed] for m in rows)


def test_a_segments_resume_is_bitwise_the_uninterrupted_run(small_run, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    train(small_run(a, *SEGMENTS, "train.steps=4", "ckpt_every=2"), progress=False)
    train(small_run(b, *SEGMENTS, "train.steps=2", "ckpt_every=2"), progress=False)
    train(small_run(b, *SEGMENTS, "train.steps=4", "ckpt_every=2"), resume=True,
          progress=False)

    def records(d):
        return [(s, [(r["tokens"], r["control"]["tree"]) for r in g["rollouts"]])
                for s, g in read_rollouts(d)]

    assert records(a) == records(b)
    wa, wb = (load_file(str(d / "checkpoints" / "step_000004" / "model" / "model.safetensors"))
              for d in (a, b))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert all(m["grad_norm"] > 0 for m in read_metrics(a))  # it did train
    losses = [[m["loss/policy"], m["adv/abs_mean"]] for m in read_metrics(a)]
    assert losses == [[m["loss/policy"], m["adv/abs_mean"]] for m in read_metrics(b)]


def test_leaf_credit_trains_bitwise_as_the_scalar_broadcast(small_run, tmp_path, monkeypatch):
    now = tmp_path / "now"
    train(small_run(now, *TREE, "train.steps=2", "ckpt_every=2"), progress=False)

    def broadcast(groups, rewards, adv, mask):  # the step's advantages before per-token credit
        return adv.to(mask.device)[:, None].expand_as(mask).contiguous(), mask, adv, {}

    monkeypatch.setattr(credit, "token_advantages", broadcast)
    old = tmp_path / "old"
    train(small_run(old, *TREE, "train.steps=2", "ckpt_every=2"), progress=False)
    wa, wb = (load_file(str(d / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
              for d in (now, old))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    for x, y in zip(read_metrics(now), read_metrics(old)):
        assert x["tree/trained_share"] == 1.0
        assert {k: v for k, v in x.items() if not k.startswith(("tree/", *TIMED))} \
            == {k: v for k, v in y.items() if not k.startswith(TIMED)}
