"""The progress display: steps/s and ETA from the steps done; without a terminal a plain line
every `every` steps on stderr, flushed, so a piped run's log shows progress while it runs,
and stdout holds the result JSON alone."""

import io
import json
import subprocess
import sys

from reroll.trainer.progress import (
    NoProgress,
    PlainProgress,
    format_duration,
    progress_bar,
    rate_and_eta,
)


def test_rate_and_eta_from_steps_done():
    # 20 steps in 4 s: 5 steps/s; 30 left take 30 / 5 = 6 s
    assert rate_and_eta(20, 4.0, 30) == (5.0, 6.0)
    assert rate_and_eta(0, 0.0, 30) == (0.0, float("inf"))


def test_format_duration():
    assert format_duration(3725.4) == "1:02:05"  # 3600 + 2*60 + 5
    assert format_duration(59.6) == "0:01:00"
    assert format_duration(float("inf")) == "?"


def test_plain_lines_every_n_steps_and_at_the_last():
    out = io.StringIO()
    bar = PlainProgress(total=5, start=0, every=2, stream=out)
    m = {"reward/mean": 0.5, "reward/accuracy": 0.25, "length/mean": 3.0}
    for step in range(1, 6):
        bar.update(step, {**m, **({"eval/greedy_accuracy": 0.75} if step == 3 else {})})
    bar.close()
    lines = out.getvalue().splitlines()
    assert [x.split(" | ")[0] for x in lines] == [
        "step 2/5 reward 0.500 acc 0.250 len 3.0",
        "step 4/5 reward 0.500 acc 0.250 len 3.0 eval 0.750",  # the last eval seen at step 3
        "step 5/5 reward 0.500 acc 0.250 len 3.0 eval 0.750",
    ]
    assert all(" steps/s ETA " in x for x in lines)
    assert lines[-1].endswith("ETA 0:00:00")  # nothing left


def test_a_pipe_gets_plain_lines_and_disabled_gets_nothing():
    assert isinstance(progress_bar(10, stream=io.StringIO()), PlainProgress)
    assert isinstance(progress_bar(10, enabled=False), NoProgress)


SMALL = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
         "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
         "rollout.max_new_tokens=4", "reward.workers=0", "train.lr=3e-4", "runtime.threads=1",
         'reward.verifiers=[{name="format", args={pattern="[0-9]", fullmatch=false}}]']


def test_a_piped_run_logs_progress_on_stderr_while_it_runs(tmp_path, device):
    steps = 60
    cmd = [sys.executable, "-m", "reroll.cli", "train", "-", *SMALL, f"model.device={device}",
           "log_every=10", f"train.steps={steps}", "ckpt_every=1000",
           f"out_dir={tmp_path / 'run'}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen, running_at_first = [], None
    for line in proc.stderr:  # read as the lines come
        if line.startswith("step "):
            if running_at_first is None:
                running_at_first = proc.poll() is None
            seen.append(line.split()[1])
    out = proc.stdout.read()
    assert proc.wait() == 0, out
    assert running_at_first, "the first progress line came only after the run ended"
    assert seen == [f"{s}/{steps}" for s in range(10, steps + 1, 10)]
    result = json.loads(out)  # stdout is the result JSON alone
    assert set(result) >= {"reward/mean", "reward/accuracy"}
