"""Asynchronous training: bounded staleness is respected, and a run killed with SIGKILL in
the middle resumes with no group lost or trained on twice (counted exactly)."""

import os
import signal
import subprocess
import sys
import time

from reroll.config_checks import load_checked
from reroll.rollout import Group
from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train
from reroll.trainer import checkpoint

ASYNC = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
         "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
         "rollout.max_new_tokens=6", "reward.workers=0", "log_every=1", "train.lr=3e-4",
         "runtime.threads=1", "runtime.max_staleness=2", "runtime.overprovision=1.5"]


def test_async_run_stays_within_the_staleness_bound(tmp_path):
    cfg = load_checked(None, ASYNC + [f"out_dir={tmp_path}", "train.steps=6", "ckpt_every=100"])
    train(cfg, progress=False)
    rows = read_metrics(tmp_path)
    assert len(rows) == 6
    # over-provisioning allows one version beyond max_staleness (2 + 1)
    assert max(r["staleness/max_lag"] for r in rows) <= 3
    for step, g in read_rollouts(tmp_path):
        assert (step - 1) - g["start_version"] <= 3  # trained at version step-1
    assert rows[-1]["pipeline/consumed"] == 24


def test_kill9_then_resume_loses_no_group_and_trains_none_twice(tmp_path):
    args = ASYNC + [f"out_dir={tmp_path}", "train.steps=8", "ckpt_every=2"]
    proc = subprocess.Popen([sys.executable, "-m", "reroll.cli", "train", "-", *args,
                             "--no-progress"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            cwd=os.getcwd())
    ck4 = tmp_path / "checkpoints" / "step_000004"
    deadline = time.time() + 240
    while not ck4.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert ck4.exists(), proc.stderr.read().decode()[-2000:] if proc.poll() is not None else ""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert checkpoint.latest(tmp_path).name in ("step_000004", "step_000006")
    at_kill = checkpoint.latest(tmp_path)
    buffered = [Group.from_json(x) for x in (at_kill / "buffers.jsonl").read_text().splitlines()]
    step_at_kill = int(at_kill.name.split("_")[1])

    train(load_checked(None, args), resume=True, progress=False)

    consumed = read_rollouts(tmp_path)
    ids = [g["group_id"] for _, g in consumed]
    assert len(ids) == 8 * 4 and len(set(ids)) == len(ids)  # 8 steps x 4 groups, none twice
    assert sorted({s for s, _ in consumed}) == list(range(1, 9))
    final = [Group.from_json(x) for x in
             (tmp_path / "checkpoints" / "step_000008" / "buffers.jsonl").read_text().splitlines()]
    later = {g["group_id"] for s, g in consumed if s > step_at_kill} | {g.group_id for g in final}
    assert {g.group_id for g in buffered} <= later  # every buffered group went on
    assert not {g.group_id for g in final} & set(ids)
    assert read_metrics(tmp_path)[-1]["pipeline/consumed"] == 32
