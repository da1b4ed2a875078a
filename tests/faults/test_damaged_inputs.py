"""Damaged or vanishing inputs end in one line and exit 2 naming what and where, never a
traceback: a model folder without its tokenizer, a checkpoint whose weights are truncated
or whose manifest was deleted (never trusted), a checkpoint rotated away while `reroll
eval` reads it, a truncated Parquet file of the rollout store, a full disk under the rollout
store, a tiny model whose heads do not divide (its leftover directory does not block the
corrected command), and `benchmarks/vs_trl.py --eval-every 0`."""

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reroll.cli import main
from reroll.trainer import checkpoint

SMALL = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
         "task.args.n_test=8", "rollout.group_size=2", "rollout.batch_groups=2",
         "rollout.max_new_tokens=3", "reward.workers=0", "runtime.threads=1", "eval.every=0"]
ROOT = Path(__file__).resolve().parents[2]


def one_line(capsys, command, after_info=False):
    err = capsys.readouterr().err
    if after_info:  # the command's own line about what it does comes first
        err = err.splitlines(keepends=True)[-1]
    assert err.startswith(f"reroll {command}: error: ") and err.count("\n") == 1, err
    return err


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 4-step run with checkpoints at steps 2 and 4 and every step recorded."""
    out = tmp_path_factory.mktemp("run") / "run"
    assert main(["train", "-", *SMALL, "train.steps=4", "ckpt_every=2", f"out_dir={out}",
                 "--no-progress"]) == 0
    return out


@pytest.fixture
def copy(run, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(run, dst)
    return dst


def test_a_model_folder_without_tokenizer_files(run, tmp_path, capsys):
    model = tmp_path / "model"
    shutil.copytree(run / "checkpoints" / "step_000004" / "model", model)
    for f in model.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "vocab")):
            f.unlink()
    assert main(["eval", "-", *SMALL, "--checkpoint", str(model)]) == 2
    err = one_line(capsys, "eval")
    assert f"{model} holds a model but no tokenizer" in err, err
    assert main(["train", "-", *SMALL, f"model.path={model}", f"out_dir={tmp_path / 'r'}",
                 "--no-progress"]) == 2
    assert f"{model} holds a model but no tokenizer" in one_line(capsys, "train")
    assert not (tmp_path / "r").exists()


def test_eval_of_a_truncated_checkpoint_is_refused(copy, capsys):
    ck = copy / "checkpoints" / "step_000004"
    st = ck / "model" / "model.safetensors"
    st.write_bytes(st.read_bytes()[: st.stat().st_size // 2])
    assert main(["eval", "-", *SMALL, "--checkpoint", str(ck)]) == 2
    err = one_line(capsys, "eval")
    assert f"checkpoint {ck} is damaged" in err and "model.safetensors has" in err, err
    with pytest.warns(RuntimeWarning, match="step_000002"):  # the run: its latest whole one
        assert main(["eval", "-", *SMALL, "--checkpoint", str(copy)]) == 0


def test_a_checkpoint_without_its_manifest_is_never_trusted(copy, capsys):
    ck = copy / "checkpoints" / "step_000004"
    (ck / "manifest.json").unlink()
    st = ck / "model" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:100])  # and its weights truncated: nothing would find it
    with pytest.warns(RuntimeWarning, match=r"manifest.json is missing.*step_000002"):
        assert checkpoint.latest(copy).name == "step_000002"
    assert main(["eval", "-", *SMALL, "--checkpoint", str(ck)]) == 2
    assert "manifest.json is missing" in one_line(capsys, "eval")
    assert main(["export", str(ck), str(copy.parent / "exported")]) == 2
    assert "manifest.json is missing" in one_line(capsys, "export")


def test_eval_of_a_checkpoint_rotated_away_while_it_is_read(copy, monkeypatch, capsys):
    from reroll import build

    real = build.load_model
    calls = []

    def rotated(path, *a, **k):  # training removes the checkpoint while eval reads it
        calls.append(path)
        if len(calls) == 1:
            shutil.rmtree(Path(path).parent)
        return real(path, *a, **k)

    monkeypatch.setattr(build, "load_model", rotated)
    assert main(["eval", "-", *SMALL, "--checkpoint", str(copy)]) == 0  # the run: retried
    assert [Path(p).parent.name for p in calls] == ["step_000004", "step_000002"]
    capsys.readouterr()
    calls.clear()
    ck = copy / "checkpoints" / "step_000002"
    assert main(["eval", "-", *SMALL, "--checkpoint", str(ck)]) == 2  # named itself: refused
    assert f"checkpoint {ck} was removed while it was read" in one_line(capsys, "eval")


def test_replay_of_a_truncated_parquet_file(copy, tmp_path, capsys):
    f = copy / "rollouts" / "step_000000002.parquet"
    f.write_bytes(f.read_bytes()[:50])
    assert main(["replay", str(copy), f"out_dir={tmp_path / 'replay'}", "--no-progress"]) == 2
    err = one_line(capsys, "replay", after_info=True)
    assert f"rollout store: {f} cannot be read, the file is damaged" in err, err


def test_replay_of_a_run_whose_store_lost_a_step(copy, tmp_path, capsys):
    (copy / "rollouts" / "step_000000003.parquet").unlink()
    assert main(["replay", str(copy), f"out_dir={tmp_path / 'replay'}", "--no-progress"]) == 2
    err = one_line(capsys, "replay")
    assert "the rollout store lacks step 3 (recorded: 1-2, 4)" in err, err
    assert "pass train.steps=2" in err
    assert main(["replay", str(copy), f"out_dir={tmp_path / 'replay'}", "train.steps=2",
                 "--no-progress"]) == 0


def test_a_full_disk_under_the_rollout_store_names_the_path(tmp_path, monkeypatch, capsys):
    import pyarrow.parquet as pq

    def full(table, where, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    out = tmp_path / "run"
    assert main(["train", "-", *SMALL, "train.steps=2", f"out_dir={out}", "--no-progress"]) == 2
    err = one_line(capsys, "train")
    assert f"could not write step 1 to {out / 'rollouts'}" in err, err
    assert "No space left on device" in err
    assert not list((out / "rollouts").glob(".*.tmp"))


def test_heads_that_do_not_divide_leave_nothing_that_blocks_the_fix(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "-", *SMALL, "train.steps=1", "model.num_kv_heads=3",
                 f"out_dir={out}", "--no-progress"]) == 2
    assert "model.num_kv_heads = 3 must divide model.num_heads = 4" in one_line(capsys, "train")
    assert main(["train", "-", *SMALL, "train.steps=1", f"out_dir={out}", "--no-progress"]) == 0


def test_vs_trl_eval_every_0_is_refused(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "vs_trl.py"),
                           "--eval-every", "0"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert "--eval-every must be >= 1" in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr
