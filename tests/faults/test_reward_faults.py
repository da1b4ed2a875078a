"""A user reward that raises, hangs past reward.timeout_s, or kills its worker process, in a
real run: the run finishes, every failed sample is counted as a score error (never trained
as 0: its group is dropped and the prompt retried), and the good prompts train."""

import pytest

from reroll.config import load_config
from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train

REWARD = '''
import os, time

def flaky(prompts, completions, answer, **kw):
    p = prompts[0]
    if p.startswith("3+"):
        raise ValueError("cannot score " + p)
    if p.startswith("4+"):
        time.sleep(30)  # past reward.timeout_s
    if p.startswith("5+") and completions[0][:1] == "7":
        os._exit(3)  # the scoring worker dies
    return [float(any(c.isdigit() for c in completions[0]))]
'''


@pytest.mark.parametrize("workers", [1])
def test_a_reward_that_raises_hangs_or_crashes_is_counted_not_trained(tmp_path, monkeypatch,
                                                                      workers):
    (tmp_path / "flaky_reward.py").write_text(REWARD)
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, [
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
