"""benchmarks/vs_trl.py's baselines (TRL's GRPOTrainer and the hand-written loop) see reroll's
prompt ids and reroll's reward on the reasoning workload (configs/reasoning.toml): the same
BOS-then-characters prompt, the task's own verifier given the whole example (its ``fields``),
and a verifier failure raised, never scored 0; the hand loop takes a start evaluated once
(benchmarks/tournament.py)."""

import dataclasses
import types
from pathlib import Path

import pytest

from reroll import build, build_rollout
from reroll.config_checks import load_checked
from reroll.models.tiny import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "reasoning.toml"


@pytest.fixture(scope="module")
def vs_trl(benchmarks_on_path):
    import vs_trl as module

    return module


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    """The tiny tokenizer as a run saves and the benchmarks load it."""
    path = tmp_path_factory.mktemp("tok")
    build_tokenizer().save_pretrained(path)
    return build.load_tokenizer(path)


@pytest.fixture(scope="module")
def task():
    cfg = load_checked(str(CONFIG), ["task.args.n_train=12", "task.args.n_test=2"])
    return build.build_task(cfg)


def test_trl_and_hand_prompts_are_reroll_prompt_ids(vs_trl, tok, task):
    texts = vs_trl.trl_prompts(tok, task)
    encode = build_rollout.encode_prompt(tok)
    assert len(texts) == len(task.train) == 12
    for text, ex in zip(texts, task.train):
        ids = tok(text=[text]).input_ids[0]  # as TRL's _tokenize_prompts calls it
        # one character a token after the BOS, nothing else (no second BOS, no EOS)
        assert ids[0] == tok.bos_token_id == 2 and ids.count(tok.bos_token_id) == 1
        assert len(ids) == len(ex.prompt) + 1 and tok.decode(ids[1:]) == ex.prompt
        assert ids == encode(ex.prompt)  # the hand loop's ids: encode itself


def test_reward_is_the_verifier_on_the_whole_example(vs_trl, tok, task):
    score = vs_trl.reward_fn(tok, task, CONFIG)
    ex = task.train[0]
    assert "####" in ex.demo and ex.fields["numbers"] and ex.fields["target"]
    assert score(ex.prompt, ex.demo) == 1.0  # the solver's own demo reaches the target
    trace, _ = ex.demo.rsplit("####", 1)
    assert score(ex.prompt, trace) == 0.0  # no answer line
    assert score(ex.prompt, trace + "#### 1+1=2") == 0.0  # an answer that misses the target
    # the same value reroll's own scorer gives the full example
    cfg = load_checked(str(CONFIG), [])
    pool = build_rollout.build_scorer(cfg, task)
    from reroll.rollout import Rollout

    r = Rollout("p", "g", [0], 1, completion=ex.demo)
    assert pool.combine(pool.submit(r, ex).result()) == 1.0


def test_a_verifier_failure_is_an_error_naming_the_prompt(vs_trl, tok, task):
    ex = task.train[0]
    bare = dataclasses.replace(ex, fields={})  # no numbers or target for the verifier
    score = vs_trl.reward_fn(tok, types.SimpleNamespace(train=[bare], verifier=task.verifier),
                             CONFIG)
    with pytest.raises(vs_trl.RewardError, match=r"verifier failed on prompt .*numbers"):
        score(ex.prompt, ex.demo)
    with pytest.raises(vs_trl.RewardError, match="not one of the task's 1 training prompts"):
        score("9 9 9 9->1:", ex.demo)


def test_trl_generation_settings_are_grpo_config_fields(vs_trl, tmp_path):
    trl = pytest.importorskip("trl")  # a benchmark-only dependency
    assert vs_trl.TRL_FASTEST in vs_trl.TRL_GENERATION
    for name, options in vs_trl.TRL_GENERATION.items():
        args = trl.GRPOConfig(output_dir=str(tmp_path / name), use_cpu=True, report_to="none",
                              **options)
        for key, value in options.items():
            assert getattr(args, key) == value
    with pytest.raises(ValueError, match="generation 'paged' is none of"):
        vs_trl.run_trl(None, None, None, None, 1, 1, 0, generation="paged")


def test_the_hand_loop_takes_a_start_evaluated_once(vs_trl, tiny_dir, task):
    # benchmarks/tournament.py evaluates the shared start once: given it, the loop's step-0
    # point is that number and its evaluator runs only at the steps it is asked for (1, 2)
    tok = build.load_tokenizer(tiny_dir)
    calls = []

    def ev(model):
        calls.append(model.training)
        return 0.5

    hp = vs_trl.Hyper(CONFIG, prompts=2, samples=2, max_new=3, lr=1e-4, clip=0.2)
    times, curve = vs_trl.run_hand(tiny_dir, tok, task, ev, 2, 1, 0, hp=hp, start=0.25)
    assert len(times) == 2
    assert [(s, acc) for s, _, acc in curve] == [(0, 0.25), (1, 0.5), (2, 0.5)]
    assert len(calls) == 2
    _, curve = vs_trl.run_hand(tiny_dir, tok, task, ev, 1, 1, 0, hp=hp)  # no start: evaluated
    assert [(s, acc) for s, _, acc in curve] == [(0, 0.5), (1, 0.5)] and len(calls) == 4


def _evaluator(values):
    """An evaluator returning ``values`` in turn (then the last), counting its calls."""
    it = iter(values)
    calls = []

    def ev(model):
        calls.append(1)
        return next(it, values[-1])

    return ev, calls


@pytest.mark.parametrize("baseline", ["hand", "trl"])
def test_a_baseline_stops_at_the_evaluation_that_reaches_the_target(vs_trl, tiny_dir, task,
                                                                   baseline):
    # tournament.py's screen and --quick: 0.3 at step 1, 0.6 at step 2 reaches 0.5, so the
    # run ends there (2 of 5 steps), not at its step budget
    if baseline == "trl":
        pytest.importorskip("trl")
    tok = build.load_tokenizer(tiny_dir)
    ev, calls = _evaluator([0.3, 0.6, 0.7])
    hp = vs_trl.Hyper(CONFIG, prompts=2, samples=2, max_new=3, lr=1e-4, clip=0.2)
    run = vs_trl.run_trl if baseline == "trl" else vs_trl.run_hand
    times, curve = run(tiny_dir, tok, task, ev, 5, 1, 0, hp=hp, start=0.25, stop_at=0.5)
    assert len(times) == 2 and len(calls) == 2
    assert [(s, acc) for s, _, acc in curve] == [(0, 0.25), (1, 0.3), (2, 0.6)]
