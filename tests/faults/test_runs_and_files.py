"""Runs and files (faults around them): one process per run directory, a failed start leaves nothing that blocks
the corrected command, SIGINT/SIGTERM stop at a safe point with a checkpoint and a resume
line, a damaged latest checkpoint falls back to the previous one, a full disk is a clear
error that keeps the previous checkpoint, and resume truncation never cuts a log."""

import os
import signal
import subprocess
import sys
import time

import pytest

from reroll.config import ConfigError
from reroll.config_checks import load_checked
from reroll.runlog import RunDir, read_metrics, read_rollouts
from reroll.runtime import train
from reroll.trainer import checkpoint

SMALL = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
         "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
         "rollout.max_new_tokens=4", "reward.workers=0", "log_every=1", "train.lr=3e-4",
         "runtime.threads=1"]


def cfg(out, *extra):
    return load_checked(None, SMALL + [f"out_dir={out}", *extra])


def test_one_process_per_run_directory(tmp_path):
    first = RunDir(cfg(tmp_path))
    with pytest.raises(ConfigError, match=rf"in use by process {os.getpid()}"):
        RunDir(cfg(tmp_path))
    first.close()
    RunDir(cfg(tmp_path)).close()  # released: the next one gets it


def test_a_failed_start_leaves_nothing_that_blocks_the_corrected_command(tmp_path):
    with pytest.raises(Exception, match="no_such_dir"):
        train(cfg(tmp_path, f"init={tmp_path / 'no_such_dir'}", "train.steps=1"),
              progress=False)
    assert not (tmp_path / "config.toml").exists()
    train(cfg(tmp_path, "train.steps=1"), progress=False)  # the corrected command runs
    assert [m["step"] for m in read_metrics(tmp_path)] == [1]


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_at_a_safe_point_with_a_checkpoint_and_resume_continues(tmp_path, sig,
                                                                               code):
    args = SMALL + [f"out_dir={tmp_path}", "train.steps=40", "ckpt_every=1000"]
    proc = subprocess.Popen([sys.executable, "-m", "reroll.cli", "train", "-", *args,
                             "--no-progress"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_metrics(tmp_path)) < 2 and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(sig)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == code, err
    last = err.strip().splitlines()[-1]
    assert "checkpoint written. Resume with: reroll train -" in last and "--resume" in last
    ck = checkpoint.latest(tmp_path)
    stopped = checkpoint.read_state(ck)["step"]
    assert 2 <= stopped < 40 and [m["step"] for m in read_metrics(tmp_path)] == \
        list(range(1, stopped + 1))
    train(load_checked(None, args), resume=True, progress=False)
    assert [m["step"] for m in read_metrics(tmp_path)] == list(range(1, 41))  # each once
    ids = [g["group_id"] for _, g in read_rollouts(tmp_path)]
    assert len(ids) == 160 and len(set(ids)) == 160


def test_a_damaged_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    train(cfg(tmp_path, "train.steps=4", "ckpt_every=2"), progress=False)
    st = tmp_path / "checkpoints" / "step_000004" / "model" / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])  # truncated
    with pytest.warns(RuntimeWarning, match=r"model.safetensors has \d+ bytes.*step_000002"):
        assert checkpoint.latest(tmp_path).name == "step_000002"
    with pytest.warns(RuntimeWarning):
        train(cfg(tmp_path, "train.steps=4", "ckpt_every=2"), resume=True, progress=False)
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert checkpoint.damage(tmp_path / "checkpoints" / "step_000004") is None  # rewritten
    (tmp_path / "checkpoints" / "step_000002" / "state.json").write_text("{")
    (tmp_path / "checkpoints" / "step_000004" / "optimizer.pt").write_bytes(b"x")
    with pytest.raises(ConfigError, match=r"no complete checkpoint.*optimizer.pt has 1 bytes"):
        checkpoint.latest(tmp_path)


def test_a_full_disk_is_a_clear_error_and_the_previous_checkpoint_stays(tmp_path, monkeypatch):
    train(cfg(tmp_path, "train.steps=2", "ckpt_every=2"), progress=False)
    import errno

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "write_manifest", full)  # the last write of a checkpoint
    with pytest.raises(checkpoint.CheckpointWriteError,
                       match=r"step 4 .*no space left on device; the previous checkpoint "
                             r".*step_000002\) is intact"):
        train(cfg(tmp_path, "train.steps=4", "ckpt_every=2"), resume=True, progress=False)
    assert checkpoint.latest(tmp_path).name == "step_000002"
    assert not list((tmp_path / "checkpoints").glob(".tmp*"))  # no half-written directory


def test_resume_truncation_is_atomic(tmp_path, monkeypatch):
    rd = RunDir(cfg(tmp_path))
    rows = "".join(f'{{"step": {i}, "x": 1}}\n' for i in range(1, 6))
    (tmp_path / "metrics.jsonl").write_text(rows)
    real = os.replace

    def killed(*a):
        raise KeyboardInterrupt  # dies between writing the kept rows and the rename

    monkeypatch.setattr("pathlib.Path.replace", lambda self, target: killed())
    with pytest.raises(KeyboardInterrupt):
        rd.truncate(3)
    assert (tmp_path / "metrics.jsonl").read_text() == rows  # the original is whole
    monkeypatch.undo()
    rd.truncate(3)
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2, 3]
    assert real is os.replace
    rd.close()


def test_eval_and_init_follow_a_run_directorys_latest_checkpoint(tmp_path, capsys):
    import json

    from reroll.cli import main

    run = tmp_path / "run"
    train(cfg(run, "train.steps=2", "ckpt_every=1"), progress=False)
    base = SMALL + ["eval.n_examples=4", "eval.k=1"]
    # --output is checked before the evaluation runs
    assert main(["eval", "-", *base, "--checkpoint", str(run), "--output",
                 str(tmp_path / "no" / "dir" / "m.json")]) == 2
    assert "--output" in capsys.readouterr().err
    assert main(["eval", "-", *base, "--checkpoint", str(run), "--output",
                 str(tmp_path / "m.json")]) == 0
    assert "eval/greedy_accuracy" in json.loads((tmp_path / "m.json").read_text())
    from reroll.build import weights_dir

    assert weights_dir(run) == run / "checkpoints" / "step_000002" / "model"
    train(cfg(tmp_path / "next", f"init={run}", "train.steps=1"), progress=False)
    assert main(["eval", "-", *base, "--checkpoint", str(tmp_path / "nothing")]) == 2


def test_a_second_process_on_a_running_directory_is_refused_naming_the_first(tmp_path):
    args = SMALL + [f"out_dir={tmp_path}", "train.steps=400", "ckpt_every=1000"]
    first = subprocess.Popen([sys.executable, "-m", "reroll.cli", "train", "-", *args,
                              "--no-progress"], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not read_metrics(tmp_path):
            time.sleep(0.05)
        second = subprocess.run([sys.executable, "-m", "reroll.cli", "train", "-", *args,
                                 "--resume", "--no-progress"], capture_output=True, text=True,
                                timeout=120)
        assert second.returncode == 2
        assert f"in use by process {first.pid}" in second.stderr
        assert first.poll() is None  # the first run goes on untouched
    finally:
        first.kill()
        first.wait()


def test_a_full_disk_tmpfs_keeps_the_previous_checkpoint(tmp_path):
    import errno

    # how much a run with one checkpoint takes; the tmpfs holds that and half a checkpoint
    ref = tmp_path / "ref"
    train(cfg(ref, "train.steps=2", "ckpt_every=2"), progress=False)
    used = sum(p.stat().st_size for p in ref.rglob("*") if p.is_file())
    ck = sum(p.stat().st_size for p in (ref / "checkpoints").rglob("*") if p.is_file())
    kb = (used + ck // 2) // 1024 + 64
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kb}k", "tmpfs",
                                            str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        with pytest.raises(checkpoint.CheckpointWriteError) as e:
            train(cfg(mnt / "run", "train.steps=4", "ckpt_every=2"), progress=False)
        assert e.value.errno == errno.ENOSPC
        assert "no space left on device" in str(e.value) and "step_000002" in str(e.value)
        assert checkpoint.latest(mnt / "run").name == "step_000002"  # intact, verified
        assert not list((mnt / "run" / "checkpoints").glob(".tmp*"))
    finally:
        # lazily: files the failed run opened may still be referenced by the traceback
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_tensorboard_holds_each_step_once_after_a_resume_replays_steps(tmp_path, monkeypatch):
    """Killed after step 4's row and before its checkpoint: the resume redoes steps 3 and 4,
    and TensorBoard (purge_step) shows each once, with the replayed value, as metrics.jsonl
    does."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    import reroll.loop

    class Killed(BaseException):
        pass

    real = reroll.loop.save_checkpoint

    def dies_at_step_4(run_dir, step, *a, **k):
        if step == 4:
            raise Killed
        return real(run_dir, step, *a, **k)

    monkeypatch.setattr(reroll.loop, "save_checkpoint", dies_at_step_4)
    with pytest.raises(Killed):
        train(cfg(tmp_path, "train.steps=5", "ckpt_every=2"), progress=False)
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2, 3, 4]
    assert checkpoint.latest(tmp_path).name == "step_000002"
    monkeypatch.undo()
    train(cfg(tmp_path, "train.steps=5", "ckpt_every=2"), resume=True, progress=False)
    rows = {m["step"]: m for m in read_metrics(tmp_path)}
    assert sorted(rows) == [1, 2, 3, 4, 5]

    files = sorted((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert len(files) == 2  # one per process
    raw: dict[str, list[int]] = {}
    for f in files:
        for ev in EventFileLoader(str(f)).Load():
            for v in ev.summary.value:
                raw.setdefault(v.tag, []).append(ev.step)
    tag = "time/step_s"  # differs between a step and its replay
    assert sorted(raw[tag]) == [1, 2, 3, 3, 4, 4, 5]  # the files hold 3 and 4 twice...
    acc = EventAccumulator(str(tmp_path / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    assert tag in tags and len(tags) == len(raw)
    for k in tags:  # ...and TensorBoard shows every step once, with the values logged last
        events = acc.Scalars(k)
        assert [e.step for e in events] == [1, 2, 3, 4, 5], (k, [e.step for e in events])
        for e in events:
            assert e.value == pytest.approx(rows[e.step][k], rel=1e-6, abs=1e-6), (k, e.step)
