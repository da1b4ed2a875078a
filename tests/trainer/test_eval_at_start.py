"""``eval.at_start``: a run that evaluates every N steps evaluates before its first step too,
unless ``eval.at_start = false``; then row 0 of metrics.jsonl is still logged (where the
training clock starts) but carries no evaluation, and every later evaluation is unchanged."""

import json

import pytest

from reroll import build
from reroll.config import ConfigError
from reroll.config_checks import load_checked
from reroll.runtime import train
from reroll.trainer import evaluate


def rows_and_calls(tmp_path, small_run, monkeypatch, *extra):
    calls = []
    real = evaluate.evaluate

    def spy(*args, **kwargs):  # every held-out evaluation of the run goes through it
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(evaluate, "evaluate", spy)
    cfg = small_run(tmp_path / "run", "train.steps=2", "eval.every=1", "eval.n_examples=4",
                    "eval.k=1", *extra)
    train(cfg, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return rows, len(calls)


def test_the_start_is_evaluated_by_default(tmp_path, small_run, monkeypatch):
    rows, calls = rows_and_calls(tmp_path, small_run, monkeypatch)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert calls == 3  # steps 0, 1 and 2
    assert all("eval/greedy_accuracy" in r and "time/eval_s" in r for r in rows)


def test_at_start_false_skips_only_the_start(tmp_path, small_run, monkeypatch):
    rows, calls = rows_and_calls(tmp_path, small_run, monkeypatch, "eval.at_start=false")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert calls == 2  # steps 1 and 2
    assert set(rows[0]) == {"step", "time"}  # the clock's start, no evaluation
    assert all("eval/greedy_accuracy" in r and "time/eval_s" in r for r in rows[1:])


def test_at_start_reaches_the_cadence():
    assert build.cadence(load_checked(None, ["eval.every=5"])).eval_at_start is True
    cad = build.cadence(load_checked(None, ["eval.every=5", "eval.at_start=false"]))
    assert (cad.eval_every, cad.eval_at_start) == (5, False)


@pytest.mark.parametrize("bad", ["eval.at_start=maybe", "eval.at_start=2"])
def test_at_start_must_be_a_bool(bad):
    with pytest.raises(ConfigError, match="eval.at_start: expected true/false"):
        load_checked(None, [bad])
