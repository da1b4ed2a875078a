"""XRPO's in-context seeding (`reroll.methods.xrpo_seeding`) against values written by hand:
the seeded prompt's text and tokens, which samples carry the seed, the token layout trained
under the plain prompt, the exemplar store's bounds and order, what the statistics and
metrics count, the config checks, and a checkpoint round trip."""

from types import SimpleNamespace

import pytest

from reroll.build_rollout import group_starter
from reroll.config_checks import load_checked
from reroll.control.allocators import Allocator
from reroll.control.controller import Controller
from reroll.control.scheduler import request_seed
from reroll.control.wiring import build_seeder
from reroll.errors import ConfigError
from reroll.methods.xrpo_seeding import ExemplarStore, ICLSeeder, seeded_prompt
from reroll.rollout import Example


class CharTok:
    """A tokenizer whose ids are the characters' code points (no BOS): the encoded prompt of
    a text is readable by hand."""

    bos_token_id, eos_token_id, chat_template = None, 0, None

    def __call__(self, text, add_special_tokens=False):
        return SimpleNamespace(input_ids=[ord(c) for c in text])


def ids(text):
    return [ord(c) for c in text]


def answer(r, text, reward, version=0):
    """What the engine and the scorer do to a sample: sampled tokens with log-probs
    -0.5, -1.5, ..., the completion text, the reward."""
    for i, c in enumerate(text):
        r.append(ord(c), -0.5 - i, version)
    r.finish, r.completion, r.reward = "stop", text, float(reward)


def test_seeded_prompt_text_by_hand():
    assert seeded_prompt([("1+1=", "2"), ("2+2=", "4")], "3+4=") == "1+1=\n2\n\n2+2=\n4\n\n3+4="
    assert seeded_prompt([], "3+4=") == "3+4="


def test_the_store_keeps_the_latest_solved_prompts_within_its_capacity():
    s = ExemplarStore(2)
    s.add("a", "A", "1")
    s.add("b", "B", "2")
    s.add("a", "A", "1'")  # solved again: now the most recent, with its new solution
    s.add("c", "C", "3")  # over capacity: "b", the oldest solved, goes
    assert list(s.items.items()) == [("a", ("A", "1'")), ("c", ("C", "3"))]
    assert s.pick(1, exclude="x") == [("c", ("C", "3"))]
    assert s.pick(5, exclude="c") == [("a", ("A", "1'"))]  # never a prompt's own solution
    assert (s.available("c"), s.available("x")) == (1, 2)
    t = ExemplarStore(2)
    t.load_state(s.state())
    assert t.items == s.items and list(t.items) == list(s.items)
    with pytest.raises(ValueError, match="capacity"):
        ExemplarStore(0)


def setup(train="seeded"):
    cfg = load_checked(None, ["rollout.group_size=2", "control.icl_samples=2",
                              "control.icl_exemplars=1", f"control.icl_train={train}",
                              "algo.correction=tis_token"])
    ctl = Controller(Allocator(2), value_of=lambda r: r.reward, seeder=build_seeder(cfg.control))
    return cfg, ctl, group_starter(cfg, CharTok())


def solve_p1(ctl, start):
    """Step 0: prompt p1 ("1+1=") answered "2" (right) and "3" (wrong)."""
    g1 = start(Example("p1", "1+1=", "2"), 0, 0, **ctl.plan("p1", 0, 2))
    answer(g1.rollouts[0], "2", 1)
    answer(g1.rollouts[1], "3", 0)
    assert ctl.next_round(g1)[0] == 0  # a correct sample: no seeding
    ctl.end_step([g1])
    return g1


def test_an_all_wrong_group_gets_a_seeded_round_and_trains_it_as_sampled():
    cfg, ctl, start = setup()
    g2 = start(Example("p2", "3+4=", "7"), 5, 1, **ctl.plan("p2", 1, 2))
    assert g2.max_size == 4  # 2 plain + 2 seeded reserved at admission
    answer(g2.rollouts[0], "1", 0)
    answer(g2.rollouts[1], "2", 0)
    assert ctl.next_round(g2) == (0, None, {})  # the store is still empty: nothing to seed
    solve_p1(ctl, start)
    n, text, control = ctl.next_round(g2)
    assert (n, text) == (2, "1+1=\n2\n\n3+4=")
    assert control == {"seed": {"exemplars": ["p1"], "trained_under": "seeded"}}
    start.extend(g2, n, 5, 1, prompt=text, control=control)
    plain, seeded = g2.rollouts[:2], g2.rollouts[2:]
    assert all("seed" not in r.control for r in plain)
    assert [r.control["seed"]["exemplars"] for r in seeded] == [["p1"], ["p1"]]
    assert [r.tokens for r in seeded] == [ids("1+1=\n2\n\n3+4=")] * 2
    assert [r.group_round for r in seeded] == [1, 1]
    assert [r.sampling.seed for r in seeded] == [request_seed(cfg.train.seed, 5, i)
                                                for i in (2, 3)]
    answer(seeded[0], "7", 1)
    answer(seeded[1], "8", 0)
    assert ctl.next_round(g2)[0] == 0  # a seeded group grows no further
    ctl.finish(g2)  # train = "seeded": stays as sampled, 12 prompt tokens ("1+1=\\n2\\n\\n3+4=")
    assert seeded[0].tokens == ids("1+1=\n2\n\n3+4=7") and seeded[0].prompt_len == 12
    ctl.end_step([g2])
    # statistics see the plain samples only; metrics count the seeded group and its solve
    assert (ctl.stats.get("p2").successes, ctl.stats.get("p2").trials) == (0, 2)
    assert ctl.metrics() == {"xrpo/seeded_groups": 1.0, "xrpo/seeded_solved": 1.0,
                             "xrpo/exemplars_stored": 1.0}
    # a prompt solved only with the seed is not an exemplar: the store still holds p1 alone
    assert list(ctl.seeder.store.items) == ["p1"]


def test_unseeded_training_puts_the_plain_prompt_back_and_keeps_the_behaviour_logprobs():
    _, ctl, start = setup("unseeded")
    solve_p1(ctl, start)
    g2 = start(Example("p2", "3+4=", "7"), 1, 1, **ctl.plan("p2", 1, 2))
    answer(g2.rollouts[0], "1", 0)
    answer(g2.rollouts[1], "2", 0)
    n, text, control = ctl.next_round(g2)
    start.extend(g2, n, 1, 1, prompt=text, control=control)
    r = g2.rollouts[2]
    answer(r, "7.", 1, version=1)
    answer(g2.rollouts[3], "9", 0, version=1)
    ctl.finish(g2)
    # trained tokens: "3+4=" (4 prompt tokens, out of the loss) then "7." with the
    # log-probs it was sampled with under the seeded prompt (mu): -0.5, -1.5
    assert r.tokens == ids("3+4=7.") and r.prompt_len == 4
    assert r.loss_mask == [False] * 4 + [True, True]
    assert r.logprobs == [0.0] * 4 + [-0.5, -1.5]
    assert r.versions == [-1] * 4 + [1, 1]
    assert [(s.start, s.end, s.source) for s in r.spans] == [(0, 4, "prompt"),
                                                             (4, 6, "sampled")]
    assert r.control["seed"] == {"exemplars": ["p1"], "trained_under": "unseeded",
                                 "seeded_prompt_len": 12}
    assert g2.rollouts[0].tokens == ids("3+4=1")  # plain samples untouched


def test_the_seeder_state_round_trips_through_the_controller():
    _, ctl, start = setup()
    solve_p1(ctl, start)
    _, other, _ = setup()
    other.load_state(ctl.state())
    assert other.seeder.store.items == ctl.seeder.store.items == {"p1": ("1+1=", "2")}


def test_seeding_rules_refuse_what_they_cannot_do():
    with pytest.raises(ConfigError, match="correction"):
        load_checked(None, ["control.icl_samples=2", "control.icl_train=unseeded",
                            "algo.correction=none"])
    with pytest.raises(ConfigError, match="single_turn"):
        load_checked(None, ["control.icl_samples=2", "rollout.workflow=tree"])
    with pytest.raises(ValueError, match="samples >= 1"):
        ICLSeeder(samples=0, exemplars=1, capacity=4)
