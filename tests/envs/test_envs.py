"""The built-in environments by hand: observations, rewards, done and info for scripted
turns, malformed actions, and every demonstration replayed through its environment
reproduces its environment turns and ends with reward 1."""

import random

import pytest

from reroll.envs import ENVIRONMENTS
from reroll.rollout import Example
from reroll.tasks import TASKS


def play(env, example, actions):
    env.reset(example)
    return [env.step(a) for a in actions]


MUL = Example("m", "123*456=", "56088")


def test_calculator_answers_a_tool_call_then_scores_the_final_answer():
    c = ENVIRONMENTS.get("calculator")()
    call, answer = play(c, MUL, ["<calc>123*456</calc>", "56088"])
    assert (call.observation, call.reward, call.done) == ("<res>56088</res>", 0.0, False)
    assert call.info == {"tool_call": True, "tool_ok": True, "answered": False}
    assert (answer.observation, answer.reward, answer.done) == ("", 1.0, True)
    assert answer.info == {"tool_call": False, "answered": True, "correct": True,
                           "used_result": True}


def test_calculator_malformed_and_off_problem_calls_and_wrong_answers():
    c = ENVIRONMENTS.get("calculator")(max_calls=2)
    bad, other, third = play(c, MUL, ["<calc>12x</calc>", "<calc>2*3</calc>", "<calc>1</calc>"])
    assert bad.observation == "<res>error</res>" and not bad.info["tool_ok"]
    assert other.observation == "<res>6</res>" and not other.info["tool_ok"]  # not the problem
    assert third.done and third.reward == 0.0  # a third call exceeds max_calls=2
    (wrong,) = play(c, MUL, ["56087"])
    assert wrong.done and wrong.reward == 0.0 and wrong.info["correct"] is False
    (frac,) = play(c, MUL, ["<calc>7/14</calc>"])
    assert frac.observation == "<res>1/2</res>"


def test_guess_says_higher_or_lower_and_ends_when_found():
    g = ENVIRONMENTS.get("guess")(n=16)
    ex = Example("g", "guess 1-16:", "11", fields={"secret": 11, "n": 16})
    a, b, c, d = play(g, ex, ["8\n", "12\n", "x\n", "11\n"])
    assert (a.observation, b.observation, c.observation) == ("higher\n", "lower\n", "invalid\n")
    assert c.info == {"invalid": True, "found": False}
    assert (d.observation, d.reward, d.done) == ("", 1.0, True)
    (out_of_range,) = play(g, ex, ["17\n"])
    assert out_of_range.info["invalid"] and not out_of_range.done


def test_countdown_feedback_names_what_is_wrong_and_lets_the_policy_retry():
    env = ENVIRONMENTS.get("countdown_feedback")()
    ex = Example("c", "3 5 2->16:", "16", demo="(3+5)*2", fields={"numbers": [3, 5, 2],
                                                                    "target": 16})
    a, b, c, d = play(env, ex, ["3+5+\n", "3*5\n", "3+5*2\n", "(3+5)*2\n"])
    assert (a.observation, a.info["invalid"]) == ("invalid\n", True)
    assert (b.observation, b.info["wrong_numbers"]) == ("use 3 5 2\n", True)
    assert (c.observation, c.info["wrong_value"], c.done) == ("=13\n", True, False)
    assert (d.observation, d.reward, d.done, d.info["solved"]) == ("", 1.0, True, True)


@pytest.mark.parametrize("env_name,task,args", [
    ("calculator", "arithmetic", {"digits": 3, "ops": "*", "n_train": 50, "n_test": 5}),
    ("guess", "guess", {"n": 16, "n_train": 50, "n_test": 5}),
    ("countdown_feedback", "countdown", {"n_train": 50, "n_test": 5}),
])
def test_every_demo_replays_through_its_environment_to_reward_one(env_name, task, args):
    env = ENVIRONMENTS.get(env_name)()
    rng = random.Random(0)
    for ex in TASKS.get(task)(0, **args).train:
        turns = env.demo(ex, rng)
        assert env.reset(ex) == ""
        reward = 0.0
        for i, (role, text) in enumerate(turns):
            if role == "env":
                continue
            res = env.step(text)
            reward += res.reward
            nxt = turns[i + 1] if i + 1 < len(turns) else None
            if nxt is None:
                assert res.done
            else:
                assert nxt == ("env", res.observation) and not res.done
        assert reward == 1.0, (ex.prompt, turns)


def test_guess_task_draws_secrets_in_range_from_separate_streams():
    t = TASKS.get("guess")(3, n=16, n_train=200, n_test=50)
    secrets = [e.fields["secret"] for e in t.train + t.test]
    assert min(secrets) >= 1 and max(secrets) <= 16 and len(set(secrets)) == 16
    assert len({e.prompt_id for e in t.train + t.test}) == 250
    assert all(e.prompt == "guess 1-16:" for e in t.train)
    again = TASKS.get("guess")(3, n=16, n_train=200, n_test=50)
    assert [e.fields for e in again.test] == [e.fields for e in t.test]  # seeded
