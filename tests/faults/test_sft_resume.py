"""`reroll sft` stopped by a signal leaves a checkpoint and prints the exact resume command;
`reroll sft --resume` then ends with the uninterrupted run's model, bit for bit, and its
metrics rows each once. Ctrl-C in the first second of `reroll train` is one line, no
traceback."""

import signal
import subprocess
import sys
import time

import pytest

from reroll import stopping
from reroll.cli import main
from reroll.runlog import read_metrics
from reroll.trainer import checkpoint

SFT = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
       "task.args.n_test=8", "sft.steps=30", "sft.batch_size=8", "sft.warmup_steps=3",
       "sft.lr=3e-3", "sft.schedule=linear", "ckpt_every=4", "reward.workers=0"]


class StopAfter(stopping.StopFlag):
    """A signal (SIGINT) that arrives during the ``n``-th step."""

    n = 13

    def __init__(self):
        super().__init__()
        self.asked = 0

    @property
    def requested(self):
        self.asked += 1
        if self.asked >= self.n:
            self.signum = signal.SIGINT
        return self.signum is not None


def test_sft_stopped_by_a_signal_resumes_to_the_uninterrupted_model(tmp_path, monkeypatch,
                                                                    capsys):
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert main(["sft", "-", *SFT, f"out_dir={whole}"]) == 0
    with monkeypatch.context() as m:
        m.setattr(stopping, "StopFlag", StopAfter)
        assert main(["sft", "-", *SFT, f"out_dir={cut}"]) == 130
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == (f"reroll sft: stopped by SIGINT after step 13; checkpoint written. Resume "
                    f"with: reroll sft - {' '.join(SFT)} out_dir={cut} --resume"), last
    assert checkpoint.read_state(checkpoint.latest(cut))["step"] == 13
    assert not (cut / "model").exists()
    assert [r["step"] for r in read_metrics(cut)] == [10]
    assert main(["sft", "-", *SFT, f"out_dir={cut}", "--resume"]) == 0
    for name in ("model.safetensors", "config.json"):
        assert (cut / "model" / name).read_bytes() == (whole / "model" / name).read_bytes()
    rows = [{k: v for k, v in r.items() if k != "time"} for r in read_metrics(cut)]
    assert rows == [{k: v for k, v in r.items() if k != "time"} for r in read_metrics(whole)]
    assert [r["step"] for r in rows] == [10, 20, 30]


def test_sft_resume_needs_a_run_and_a_finished_one_has_nothing_left(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["sft", "-", *SFT, "sft.steps=2", f"out_dir={out}", "--resume"]) == 2
    assert "holds no run to resume" in capsys.readouterr().err
    assert main(["sft", "-", *SFT, "sft.steps=2", f"out_dir={out}"]) == 0
    capsys.readouterr()
    model = (out / "model" / "model.safetensors").read_bytes()
    assert main(["sft", "-", *SFT, "sft.steps=2", f"out_dir={out}", "--resume"]) == 0
    assert "nothing left to train" in capsys.readouterr().out
    assert (out / "model" / "model.safetensors").read_bytes() == model


@pytest.mark.parametrize("after", [0.3, 1.0])
def test_ctrl_c_in_the_first_second_of_train_is_one_line(tmp_path, after):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "reroll.cli", "train", "-",
                             "model.max_position=32", "reward.workers=0", "task.args.digits=1",
                             "task.args.n_train=40", "task.args.n_test=8", f"out_dir={out}",
                             "--no-progress"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(after)
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1]
    assert "Traceback" not in err, err
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("reroll train: "), err
    if (out / "config.toml").is_file():  # the run had started: it says how to resume
        assert last.endswith("--resume"), err
