"""A user reward that raises, hangs past reward.timeout_s, or kills its worker process, in a
real run: the run finishes, every failed sample is counted as a score error (never trained
as 0: its group is dropped and the prompt retried), and the good prompts train. The crash
is certain: the first call of the run kills its worker, and the pool counts it."""

import os
import warnings

import pytest

from reroll.config_checks import load_checked
from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train
from reroll.verifiers.pool import ScoringPool

REWARD = '''
import os, time

CRASHED = {crashed!r}

def flaky(prompts, completions, answer, **kw):
    if not os.path.exists(CRASHED):  # the first call of the run kills its scoring worker
        open(CRASHED, "w").write(str(os.getpid()))
        os._exit(3)
    p = prompts[0]
    if p.startswith("3+"):
        raise ValueError("cannot score " + p)
    if p.startswith("4+"):
        time.sleep(30)  # past reward.timeout_s
    return [float(any(c.isdigit() for c in completions[0]))]
'''


@pytest.mark.parametrize("workers", [1])
def test_a_reward_that_raises_hangs_or_crashes_is_counted_not_trained(tmp_path, monkeypatch,
                                                                      workers):
    crashed = tmp_path / "crashed.pid"
    (tmp_path / "flaky_reward.py").write_text(REWARD.format(crashed=str(crashed)))
    monkeypatch.chdir(tmp_path)
    pools = []
    init = ScoringPool.__init__

    def recording(self, *a, **kw):
        init(self, *a, **kw)
        pools.append(self)

    monkeypatch.setattr(ScoringPool, "__init__", recording)
    cfg = load_checked(None, [
        "model.max_position=32", "task.args.digits=1", "task.args.n_train=60",
        "task.args.n_test=10", "rollout.group_size=2", "rollout.batch_groups=4",
        "rollout.max_new_tokens=3", f"reward.workers={workers}", "reward.timeout_s=1.0",
        "log_every=1", "runtime.threads=1", "train.steps=4", f"out_dir={tmp_path / 'run'}",
        'reward.verifiers=[{name="python", args={fn="flaky_reward:flaky"}}]'])
    train(cfg, progress=False)
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    last = rows[-1]
    assert last["score_errors/python"] >= 1 and last["pipeline/dropped_scoring_error"] >= 1
    trained = {g["example"]["prompt"][:2] for _, g in read_rollouts(tmp_path / "run")}
    assert not trained & {"3+", "4+"}  # never trained: their scores are errors, not 0s
    for _, g in read_rollouts(tmp_path / "run"):
        assert all(r["reward"] is not None for r in g["rollouts"])
    # the worker really died (in a scoring process, not this one), once, and was replaced
    assert crashed.is_file() and int(crashed.read_text()) != os.getpid()
    stats = [p.stats() for p in pools]
    assert sum(s["crashes"] for s in stats) == 1, stats
    assert sum(s["worker_restarts"] for s in stats) >= 1, stats
    assert sum(s["errors"].get("python", 0) for s in stats) >= last["score_errors/python"]


BROKEN = '''
import os

def raises(prompts, completions, **kw):
    raise ValueError("no score for " + prompts[0])

def nan(prompts, completions, **kw):
    return [float("nan")]

def text(prompts, completions, **kw):
    return ["1.0"]

def exits(prompts, completions, **kw):
    os._exit(3)
'''


@pytest.mark.parametrize(("fn", "workers", "error"), [
    ("raises", 1, "raised ValueError: no score for"),
    ("nan", 0, "returned nan, expected a finite float"),
    ("text", 0, "returned '1.0', expected a finite float"),
    ("exits", 1, "died 2 times, more than reward.max_worker_crashes=1"),
])
def test_a_reward_that_always_fails_is_reported_once_then_stops_the_run(tmp_path, monkeypatch,
                                                                         fn, workers, error):
    from reroll.errors import RewardError

    (tmp_path / "broken_reward.py").write_text(BROKEN)
    monkeypatch.chdir(tmp_path)
    cfg = load_checked(None, [
        "model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
        "task.args.n_test=4", "rollout.group_size=2", "rollout.batch_groups=2",
        "rollout.max_new_tokens=3", f"reward.workers={workers}", "reward.max_errors=6",
        "reward.max_worker_crashes=1", "runtime.threads=1", "train.steps=3",
        f"out_dir={tmp_path / 'run'}",
        f'reward.verifiers=[{{name="python", args={{fn="broken_reward:{fn}"}}}}]'])
    with warnings.catch_warnings(record=True) as caught, pytest.raises(RewardError) as stop:
        warnings.simplefilter("always")
        train(cfg, progress=False)
    assert error in str(stop.value) and f"broken_reward:{fn}" in str(stop.value)
    reports = [str(w.message) for w in caught if "scoring failed on prompt" in str(w.message)]
    # once, not once per sample (a worker-killing reward may stop the run before any group
    # of it is closed: then the stop message is the one report)
    assert len(reports) == (fn != "exits") or (fn == "exits" and len(reports) <= 1), reports
    assert all(f"broken_reward:{fn}" in r and "prompt '" in r for r in reports)


def test_a_reward_defined_in_the_running_script_is_refused_at_load_with_the_fix(tmp_path,
                                                                               monkeypatch):
    import sys

    from reroll.errors import RewardError

    monkeypatch.setattr(sys.modules["__main__"], "script_reward",
                        lambda prompts, completions, **kw: [1.0], raising=False)
    cfg = load_checked(None, [
        "model.max_position=32", "task.args.digits=1", "task.args.n_train=8",
        "task.args.n_test=2", "rollout.group_size=2", "rollout.batch_groups=2",
        "rollout.max_new_tokens=2", "reward.workers=1", "runtime.threads=1", "train.steps=1",
        f"out_dir={tmp_path / 'run'}",
        'reward.verifiers=[{name="python", args={fn="__main__:script_reward"}}]'])
    with pytest.raises(RewardError, match=r"defined in the script being run.*reward.workers=0"):
        train(cfg, progress=False)  # refused before any step, not abandoned prompt by prompt
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
