"""ARRoL, the pure parts: the balance objective and the pruning rule on
scripted predictions (by hand, ties, finished-early members, and against every subset), the
warm-up's seeded cut, one group's gate and its records, the quality head's BCE step by hand
on a 2-feature toy case, the head's tensors, the control side (rules, labels, resume,
metrics) and the config checks."""

import itertools
import math
import random

import pytest
import torch

from reroll.engine.quality import (
    GroupGate,
    QualityHead,
    balance,
    head_from_tensors,
    head_tensors,
    prefix_confidence,
    random_survivors,
    rank_draw,
    split_weights,
    survivors,
)
from reroll.methods.arrol import PRUNED, ARRoL
from reroll.methods.arrol_head import head_step
from reroll.rollout import Example, Group, PruneRule, Rollout, SamplingParams

# ---- the objective and the rule --------------------------------------------------------


def test_balance_is_pairwise_disagreement_in_x():
    # x = 2p - 1: 0.9 -> 0.8, 0.1 -> -0.8, 0.5 -> 0: sum x^2 = 1.28, sum x = 0 -> J = 1.28
    assert balance([0.9, 0.1, 0.5]) == pytest.approx(1.28)
    # all sure successes: x = 1, 1 -> 2 - 4 = -2 (no variance to expect)
    assert balance([1.0, 1.0]) == pytest.approx(-2.0)
    # E[sum of squares] = (n (n - 1) + J) / (4 n): for p = 0.5, 0.5: (2 + 0) / 8 = 1/4,
    # which is E[(r1 - r2)^2] / 2 = P(r1 != r2) / 2 = 1/4
    assert (2 * 1 + balance([0.5, 0.5])) / 8 == pytest.approx(0.25)


def test_the_rule_keeps_a_balanced_group():
    # 6 live, keep 4. sorted (p, i): (.1,1) (.2,3) (.4,5) (.7,4) (.8,2) (.9,0); x = -.8 -.6
    # -.2 .4 .6 .8. j = number taken from the top, the rest from the bottom:
    # j=0 {1,3,5,4}? no: bottom 4 = -.8 -.6 -.2 .4: sq 1.2, sum -1.2 -> 1.2 - 1.44 = -0.24
    # j=1 bottom 3 + top 1: -.8 -.6 -.2 .8: sq 1.68, sum -.8 -> 1.68 - .64 = 1.04
    # j=2 bottom 2 + top 2: -.8 -.6 .6 .8: sq 2.0, sum 0 -> 2.0  (best)
    # j=3 bottom 1 + top 3: -.8 .4 .6 .8: sq 1.8, sum 1.0 -> 0.8
    # j=4 top 4: -.2 .4 .6 .8: sq 1.2, sum 1.6 -> 1.2 - 2.56 = -1.36
    preds = {0: 0.9, 1: 0.1, 2: 0.8, 3: 0.2, 4: 0.7, 5: 0.4}
    assert survivors(preds, [], 4) == [0, 1, 2, 3]


def test_finished_members_always_survive_and_steer_the_balance():
    # member 5 finished early at p = .95 (x = .9); keep 3: two of the five live ones.
    # live sorted: (.1,1) (.3,3) (.6,2) (.8,4) (.9,0), x = -.8 -.4 .2 .6 .8
    # j=0 {1,3}: .9 -.8 -.4: sq 1.61, sum -.3 -> 1.52 (best)
    # j=1 {1,0}: .9 -.8 .8: sq 2.09, sum .9 -> 1.28
    # j=2 {4,0}: .9 .6 .8: sq 1.81, sum 2.3 -> -3.48
    preds = {0: 0.9, 1: 0.1, 2: 0.6, 3: 0.3, 4: 0.8, 5: 0.95}
    assert survivors(preds, [5], 3) == [1, 3, 5]
    # as many finished as kept: every live member goes
    assert survivors(preds, [2, 5, 4], 3) == [2, 4, 5]
    assert survivors(preds, [0, 1, 2, 3], 3) == [0, 1, 2, 3]  # more finished: all of them
    # no more live members than places: none goes
    assert survivors({0: 0.2, 1: 0.9, 2: 0.5}, [2], 3) == [0, 1, 2]


def test_ties_go_to_the_smallest_member_indices():
    # all p = 1/2: every set has J = 0, and every candidate takes 0 and 1 first
    assert survivors({0: 0.5, 1: 0.5, 2: 0.5, 3: 0.5}, [], 2) == [0, 1]
    # equal p: the smaller index is taken first from either end. p .8 .2 .2 .8, keep 2:
    # j=0: the two lowest {1, 2}: x -.6 -.6 -> .72 - 1.44 = -.72; j=1: the highest (.8: 0
    # before 3) and the lowest of the rest (.2: 1 before 2) {0, 1}: .72 - 0 = .72 (best);
    # j=2: {0, 3}: -.72
    assert survivors({0: 0.8, 1: 0.2, 2: 0.2, 3: 0.8}, [], 2) == [0, 1]
    # a J tie between two candidates: x = -.5, .5 (p .25, .75) and a member at p = .5:
    # keep 2 of {0: .75, 1: .5, 2: .25}: {2,1}: .25 - .25 = 0; {2,0}: .5 - 0 = .5 (best)
    assert survivors({0: 0.75, 1: 0.5, 2: 0.25}, [], 2) == [0, 2]
    # mirrored sets with equal J: {0: .9, 1: .1, 2: .5}, finished 2 (x = 0), keep 2: with
    # {1}: .64 - .64 = 0; with {0}: the same -> tie -> the smaller index list [0, 2]
    assert survivors({0: 0.9, 1: 0.1, 2: 0.5}, [2], 2) == [0, 2]


def test_the_rule_attains_the_best_balance_of_any_subset():
    rng = random.Random(0)
    for _ in range(300):
        n_all = rng.randint(2, 9)
        preds = {i: rng.choice([rng.random(), round(rng.random(), 1)]) for i in range(n_all)}
        fin = rng.sample(range(n_all), rng.randint(0, n_all // 3))
        keep = rng.randint(max(1, len(fin)), n_all)
        got = survivors(preds, fin, keep)
        live = [i for i in preds if i not in fin]
        m = keep - len(fin)
        best = max(balance([preds[i] for i in fin + list(s)])
                   for s in itertools.combinations(live, m))
        assert set(fin) <= set(got) and len(got) == keep
        assert balance([preds[i] for i in got]) == pytest.approx(best, abs=1e-9)


def test_the_warm_up_cut_keeps_the_smallest_draws_of_the_members_own_seeds():
    assert rank_draw(7) == rank_draw(7) and rank_draw(7) != rank_draw(8)
    draws = {0: 0.4, 1: 0.9, 2: 0.1, 3: 0.4, 4: 0.7}
    # finished 4 survives; two more: the smallest draws 0.1 (2), then 0.4 tie -> index 0
    assert random_survivors(draws, [4], 3) == [0, 2, 4]
    us = [rank_draw(s) for s in range(4000)]
    assert abs(sum(us) / len(us) - 0.5) < 0.02  # uniform: sd of the mean 0.0046


# ---- one group's gate and its records --------------------------------------------------


def member(i: int, seed: int | None = None) -> Rollout:
    return Rollout(prompt_id="p", group_id="g", tokens=[1, 2], prompt_len=2, index_in_group=i,
                   sampling=SamplingParams(seed=100 + i if seed is None else seed))


def test_the_gate_decides_once_every_member_is_in_and_records_each_fate():
    rule = PruneRule(at=3, keep=3, size=6)
    gate, ms = GroupGate(rule), [member(i) for i in range(6)]
    preds = [0.9, 0.1, 0.6, 0.3, 0.8, 0.95]
    gate.arrive(ms[5], preds[5], 1, version=2, finished=True)  # ended after 2 tokens
    for i in range(5):
        assert not gate.ready
        gate.arrive(ms[i], preds[i], 3, version=2)
    assert gate.ready
    assert gate.decide(warm=True) == {0, 2, 4}  # as in the hand-computed case above
    recs = [m.control["arrol"] for m in ms]
    assert [d["decision"] for d in recs] == ["pruned", "kept", "pruned", "kept", "pruned",
                                             "finished"]
    assert recs[5] == {"p": 0.95, "at": 1, "version": 2, "decision": "finished",
                       "mode": "head"}
    assert all(d["at"] == 3 and d["mode"] == "head" for d in recs[:5])
    # the warm-up's cut: by the members' draws
    gate2 = GroupGate(rule)
    for i, m in enumerate([member(i) for i in range(6)]):
        gate2.arrive(m, preds[i], 3 if i < 5 else 1, version=0, finished=i == 5)
    draws = {i: rank_draw(100 + i) for i in range(5)}
    want = set(range(5)) - set(sorted(draws, key=lambda i: (draws[i], i))[:2])
    assert gate2.decide(warm=False) == want


def test_a_restored_gate_knows_the_members_that_finished_before():
    rule = PruneRule(at=2, keep=2, size=3, settled=((2, 0.9, 1),))
    gate = GroupGate(rule)
    gate.arrive(member(0), 0.8, 2, version=1)
    assert not gate.ready
    again = member(0)
    again.control["arrol"] = {"p": 0.8, "at": 2, "version": 1}
    gate.arrive(again, 0.3, 4, version=2)  # seen again (resumed): keeps its first prediction
    gate.arrive(member(1), 0.1, 2, version=1)
    # finished 2 (x .8) + one of {0: x .6, 1: x -.8}: {1}: 1.28 - 0 = 1.28 beats {0}
    assert gate.ready and gate.decide(warm=True) == {0}


# ---- the head ----------------------------------------------------------------------------


def test_one_bce_step_by_hand_on_two_features():
    # width 1 + the position feature k / at (no log-prob features): two features. Zero
    # init: p = 1/2 for both.
    head = QualityHead(1, at=2, confidence=False)
    h = torch.tensor([[1.0], [-1.0]])
    k = torch.tensor([2, 1])  # fractions 1 and 0.5
    lp = torch.tensor([[-0.5, -1.0], [-2.0, -3.0]])  # not features of this head
    y = torch.tensor([1.0, 0.0])
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    m = head_step(head, opt, h, k, lp, y)
    # before: BCE ln 2, Brier 1/4, p >= 1/2 predicts success for both: accuracy 1/2
    assert m["arrol/head_bce"] == pytest.approx(math.log(2))
    assert m["arrol/head_brier"] == pytest.approx(0.25)
    assert m["arrol/head_accuracy"] == 0.5
    # grad = mean (p - y) x: ((-.5)[1, 1] + (.5)[-1, .5]) / 2 = [-.5, -.125]; bias:
    # (-.5 + .5) / 2 = 0. SGD at 0.1: w = [.05, .0125], b = 0
    assert head.net.weight.tolist() == [[pytest.approx(0.05), pytest.approx(0.0125)]]
    assert head.net.bias.tolist() == [0.0]
    # after: logits .05 + .0125 = .0625 (y 1) and -.05 + .00625 = -.04375 (y 0)
    after = (math.log1p(math.exp(-0.0625)) + math.log1p(math.exp(-0.04375))) / 2
    assert m["arrol/head_bce_after"] == pytest.approx(after)
    # Adam's first step moves each weight by lr * g / (|g| + eps): [.1, .1], bias 0
    head = QualityHead(1, at=2, confidence=False)
    head_step(head, torch.optim.Adam(head.parameters(), lr=0.1), h, k, lp, y)
    assert head.net.weight.tolist() == [[pytest.approx(0.1), pytest.approx(0.1)]]
    assert head.net.bias.tolist() == [0.0]
    # with the log-prob features [h, k / at, mean lp, min lp] the gradient gains two entries,
    # mean (p - y) lp = ((-.5)[-.5, -1] + (.5)[-2, -3]) / 2 = [-.375, -.5]: SGD at 0.1
    # gives [.05, .0125, .0375, .05]
    head = QualityHead(1, at=2)
    head_step(head, torch.optim.SGD(head.parameters(), lr=0.1), h, k, lp, y)
    assert head.net.weight.tolist() == [[pytest.approx(x) for x in (0.05, 0.0125, 0.0375,
                                                                       0.05)]]


def test_prefix_confidence_is_the_mean_and_the_min_log_prob():
    assert prefix_confidence([-0.5, -2.0, -0.25]) == (pytest.approx(-0.25 * 11 / 3), -2.0)
    assert prefix_confidence([]) == (0.0, 0.0)  # k = 0: nothing sampled yet


def test_the_head_travels_as_tensors_next_to_the_policy_weights():
    head = QualityHead(4, at=3, hidden=5, seed=1)
    with torch.no_grad():
        head.net[2].weight.fill_(0.5)
    t = head_tensors(head, warm=True)
    assert t["arrol.at"].item() == 3 and t["arrol.warm"].item()
    policy, part = split_weights({"model.w": torch.ones(2), **t})
    assert list(policy) == ["model.w"] and set(part) == set(t)
    back, warm = head_from_tensors(part, 4)
    h, k, lp = torch.randn(6, 4), torch.tensor([0, 1, 2, 3, 3, 3]), torch.randn(6, 2)
    assert warm and torch.equal(back.predict(h, k, lp), head.predict(h, k, lp))
    plain, _ = head_from_tensors(head_tensors(QualityHead(4, at=3, confidence=False), False),
                                 4)
    assert not plain.confidence and plain.net.in_features == 5
    # the features: h, k / at, then the log-prob mean and min
    lin = QualityHead(2, at=4)
    with torch.no_grad():
        lin.net.weight.copy_(torch.tensor([[0.0, 0.0, 2.0, 1.0, 10.0]]))
    lp = torch.tensor([[-0.5, -1.0], [0.0, 0.0]])
    # 2 * 2/4 - 0.5 - 10 = -9.5; 2 * 4/4 = 2
    assert lin(torch.zeros(2, 2), torch.tensor([2, 4]), lp).tolist() == [-9.5, 2.0]


# ---- the control side ------------------------------------------------------------------


def test_the_pruner_sizes_groups_and_hands_out_its_rule():
    p = ARRoL(8, 6, overprovision=1.5)
    assert (p.size, p.keep, p.at) == (12, 8, 1)  # ceil(12), max_new_tokens // 4
    assert ARRoL(8, 13).at == 3 and ARRoL(8, 3).at == 1
    assert ARRoL(10, 6, overprovision=1.1).size == 11  # 11.000000000000002 -> 11
    assert ARRoL(4, 6, overprovision=1.01).size == 5
    with pytest.raises(ValueError, match="must be below rollout.max_new_tokens"):
        ARRoL(4, 3, at=3)
    rs = [member(i) for i in range(12)]
    p.prepare(rs)
    assert all(r.sampling.prune == PruneRule(1, 8, 12) for r in rs)
    back = Rollout.from_json(rs[0].to_json())
    assert back.sampling.prune == PruneRule(1, 8, 12)


def group_of(recs: list[tuple[str, dict, int]]) -> Group:
    g = Group("g", Example("p", "1+1=", "2"), len(recs))
    for i, (finish, rec, resp) in enumerate(recs):
        r = member(i)
        r.sampling.prune = PruneRule(2, 2, len(recs))
        for _ in range(resp):
            r.append(7, -1.0, 0)
        r.finish, r.control["arrol"], r.reward = finish, dict(rec), float(i % 2)
        g.rollouts.append(r)
    return g


def test_settle_labels_survivors_and_takes_the_pruned_out_of_the_loss():
    g = group_of([("stop", {"decision": "kept"}, 5), ("pruned", {"decision": "pruned"}, 2),
                  ("stop", {"decision": "finished"}, 1), ("stop", {"decision": "kept"}, 4)])
    ARRoL(2, 6, at=2).settle(g, lambda r: r.reward >= 1.0)
    rs = g.rollouts
    assert [r.control["arrol"].get("correct") for r in rs] == [False, None, False, True]
    assert rs[1].loss_exclusion == PRUNED and rs[1].sample_weight == 0.0
    assert all(r.loss_exclusion is None and r.sample_weight == 1.0 for r in rs[::2])
    m = ARRoL.metrics([g])
    # 1 pruned at 2 tokens; the kept ones went 5 - 2 = 3 and 4 - 2 = 2 past the checkpoint
    assert m == {"control/arrol_pruned": 1.0, "control/arrol_finished_early": 1.0,
                 "control/arrol_random_groups": 0.0, "control/arrol_pruned_tokens": 2.0,
                 "control/arrol_tokens_saved_est": 2.5, "control/arrol_mixed_groups": 1.0}


def test_resume_gives_undecided_members_the_ones_that_finished():
    g = group_of([("running", {}, 1), ("stop", {"p": 0.7, "at": 0, "decision": "finished"}, 1),
                  ("running", {"p": 0.2, "at": 2}, 2)])
    ARRoL(2, 6, at=2).resume(g)
    assert g.rollouts[0].sampling.prune.settled == ((1, 0.7, 0),)
    assert g.rollouts[2].sampling.prune.settled == ((1, 0.7, 0),)
    decided = group_of([("running", {"decision": "kept"}, 3), ("pruned",
                                                              {"decision": "pruned"}, 2)])
    ARRoL(1, 6, at=2).resume(decided)
    assert decided.rollouts[0].sampling.prune.settled == ()


# ---- config ------------------------------------------------------------------------------


@pytest.mark.parametrize("extra, match", [
    (["control.pruner_args={at=2}"], "control.pruner = \"none\" takes no pruner_args"),
    (["control.pruner=arrol", "control.pruner_args={at=4}"], "must be below rollout"),
    (["control.pruner=arrol", "control.pruner_args={overprovision=1.0}"], "overprovision"),
    (["control.pruner=arrol", "control.pruner_args={atx=1}"], "did you mean 'at'"),
    (["control.pruner=arrol", "control.allocator=ar3po_stages"], "control.allocator"),
    (["control.pruner=arrol", "control.duet_abort=true"], "control.duet_abort"),
    (["control.pruner=arrol", "algo.dynamic_sampling=true"], "algo.dynamic_sampling"),
    (["control.pruner=arrol", "control.dot_k=2"], "control.dot_k"),
    (["control.pruner=arrol", "replay.buffer_size=8"], "replay.buffer_size"),
    (["control.pruner=arrol", "rollout.workflow=multi_turn", "rollout.env=guess"],
     "rollout.workflow"),
    (["control.pruner=arrol", "engine.max_batch=5"], "engine.max_batch"),
    (["control.pruner=arrol", "engine.name=openai", "engine.server=reroll",
      "engine.base_url=http://127.0.0.1:9"], "engine.name"),
    (["control.pruner=arrol", "runtime.kind=ray"], "runtime.kind"),
])
def test_combinations_that_cannot_work_are_refused_naming_the_key(tmp_path, small_run, extra,
                                                                   match):
    from reroll.config import ConfigError

    with pytest.raises(ConfigError, match=match):
        small_run(tmp_path, *extra)
