"""Held-out evaluation: accuracy per difficulty level (``Example.fields["difficulty"]``) from
known verdicts, and the metrics left as they were for examples without a level; the
evaluation's engine has ``eval.max_batch`` slots, and its greedy tokens do not depend on it."""

import pytest

import reroll.trainer.evaluate as ev
from reroll.config_checks import load_checked
from reroll.rollout import Example, Score, new_group


def _examples(levels):
    return [Example(prompt_id=f"p{i}", prompt="1+1=", answer="2",
                    fields={} if lv is None else {"difficulty": lv})
            for i, lv in enumerate(levels)]


def _fake_run(correct):
    """An evaluator run whose sample j of example i is right when ``correct[i][j]`` (the
    greedy run uses the first entry; None is a failed score)."""

    async def run(model, plan, examples, scorer, encode, params, n, device):
        groups = []
        for i, ex in enumerate(examples):
            g = new_group(ex, n, [1], params, 0)
            for j, r in enumerate(g.rollouts):
                ok = correct[i][j]
                r.scores = [Score(name="numeric", error="boom") if ok is None
                            else Score(name="numeric", value=float(ok))]
            groups.append(g)
        return groups

    return run


class _Tok:
    eos_token_id = 0


def test_per_level_greedy_accuracy_and_sampled_pass1(monkeypatch):
    levels = ["easy", "easy", "medium", "medium", "medium", "hard"]
    correct = [[1, 1, 1, 1], [1, 0, 1, 1],  # easy: greedy 2/2, sampled 4/4 and 3/4
               [1, 0, 0, 0], [0, 0, 0, 1], [None, 1, 1, 1],  # medium: the third failed
               [0, 0, 0, 0]]  # hard: nothing right
    monkeypatch.setattr(ev, "_run", _fake_run(correct))
    m = ev.evaluate(None, _Tok(), _examples(levels), None, None, ev.plan(load_checked(None, []), _Tok()), k=4)
    # greedy (first sample): easy 2/2; medium 1 of the 2 scored (the failed one left out)
    assert m["eval/greedy_accuracy"] == pytest.approx(3 / 5)
    assert m["eval/greedy_accuracy_easy"] == 1.0
    assert m["eval/greedy_accuracy_medium"] == 0.5
    assert m["eval/greedy_accuracy_hard"] == 0.0
    assert m["eval/greedy_score_errors"] == 1.0
    # sampled pass@1 = c / n per example: easy (4/4 + 3/4) / 2; medium (1/4 + 1/4) / 2
    assert m["eval/pass@1_sampled_easy"] == pytest.approx(0.875)
    assert m["eval/pass@1_sampled_medium"] == pytest.approx(0.25)
    assert m["eval/pass@1_sampled_hard"] == 0.0
    assert m["eval/pass@1_sampled"] == pytest.approx((1 + 0.75 + 0.25 + 0.25 + 0) / 5)


def test_examples_without_a_level_keep_the_metrics_as_they_were(monkeypatch):
    correct = [[1, 0], [0, 0], [1, 1]]
    monkeypatch.setattr(ev, "_run", _fake_run(correct))
    m = ev.evaluate(None, _Tok(), _examples([None, None, None]), None, None,
                    ev.plan(load_checked(None, []), _Tok()), k=2)
    assert {k for k in m if not k.startswith("eval/env/")} == {
        "eval/greedy_accuracy", "eval/greedy_score_errors", "eval/pass@2",
        "eval/pass@1_sampled", "eval/sampled_score_errors", "eval/n_examples"}
    assert m["eval/greedy_accuracy"] == pytest.approx(2 / 3)
    # a level only on some examples: reported over those alone
    m = ev.evaluate(None, _Tok(), _examples([None, "hard", "hard"]), None, None,
                    ev.plan(load_checked(None, []), _Tok()), k=1)
    assert m["eval/greedy_accuracy_hard"] == 0.5 and "eval/greedy_accuracy_None" not in m


class _Task:
    def __init__(self, examples):
        self.test = examples


class _Scorer:
    closed = False

    def close(self):
        self.closed = True


def test_held_out_eval_takes_the_first_n_examples_and_closes_only_its_own_scorer(monkeypatch):
    seen = []

    async def run(model, plan, examples, scorer, encode, params, n, device):
        seen.append((model, len(examples), scorer, n, device))
        return await _fake_run([[1, 1]] * len(examples))(model, plan, examples, scorer,
                                                        encode, params, n, device)

    monkeypatch.setattr(ev, "_run", run)
    cfg = load_checked(None, ["eval.n_examples=3", "eval.k=2"])
    given = _Scorer()
    held_out = ev.HeldOutEval(cfg, _Tok(), _Task(_examples([None] * 5)), given, device="cpu",
                              k=1)
    m = held_out("model")
    assert m["eval/n_examples"] == 3.0 and "eval/pass@2" not in m
    assert seen == [("model", 3, given, 1, "cpu")]
    held_out.close()
    assert not given.closed  # the run's scorer: its owner closes it
    built = _Scorer()
    monkeypatch.setattr("reroll.build_rollout.build_scorer", lambda cfg, task: built)
    held_out = ev.HeldOutEval(cfg, _Tok(), _Task(_examples([None] * 5)))  # eval.k, own scorer
    seen.clear()
    assert held_out("model")["eval/pass@2"] == 1.0
    assert [s[3] for s in seen] == [1, 2] and seen[0][2] is built
    held_out.close()
    assert built.closed


def test_eval_max_batch_sets_the_slots_and_not_the_tokens(tiny_dir, small_run, tmp_path,
                                                          monkeypatch):
    # 12 held-out prompts of the tiny run, greedy, with 2 slots (six waves, a thin tail) and
    # with 12 (all at once): the engine has the slots asked for, and every response is the
    # same token for token, so the accuracy is too. Exact on every CPU: the slot count
    # changes the matmuls' shapes, so the logits may differ in their last bits (float32,
    # about 1e-6 here), while the smallest top-1/top-2 logit gap along these greedy
    # responses is 0.11 (measured in float64 on this model), five orders of magnitude more
    from reroll import build
    from reroll.models import load

    model, tok = load(tiny_dir)
    slots, responses = [], []
    real_engine, real_run = build.build_engine, ev._run

    def engine(*args, **kwargs):
        core = real_engine(*args, **kwargs)
        slots.append(core.max_batch)
        return core

    async def run(*args):
        groups = await real_run(*args)
        responses.append([(r.tokens, r.completion, r.finish) for g in groups
                          for r in g.rollouts])
        return groups

    monkeypatch.setattr(build, "build_engine", engine)
    monkeypatch.setattr(ev, "_run", run)
    metrics = []
    for n in (2, 12):
        cfg = small_run(tmp_path / f"run{n}", f"init={tiny_dir}", "eval.n_examples=12",
                        "eval.k=1", "rollout.max_new_tokens=6", f"eval.max_batch={n}")
        held_out = ev.HeldOutEval(cfg, tok, build.build_task(cfg))
        metrics.append(held_out(model))
        held_out.close()
    assert slots == [2, 12]
    assert len(responses[0]) == 12 and responses[0] == responses[1]
    assert metrics[0] == metrics[1]
