"""The run directory rule (`reroll.runlog.claim`): new and empty, or reroll's own (its
marker); never the current directory by accident, a file, a directory of a user's files or
an unwritable one; ``~`` is the home directory. Each refusal is exit 2 with one line naming
the directory, and nothing of the user's is changed. Applies to train, sft and replay (they
all open a `RunDir`)."""

import os
import stat

import pytest

from reroll.cli import main
from reroll.runlog import MARKER

SMALL = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
         "task.args.n_test=8", "rollout.group_size=2", "rollout.batch_groups=2",
         "rollout.max_new_tokens=3", "reward.workers=0", "runtime.threads=1", "train.steps=1",
         "sft.steps=1", "sft.batch_size=4", "sft.warmup_steps=0"]


def files(path):
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file()}


def refused(capsys, command, out_dir, *extra):
    code = main([command, "-", *SMALL, f"out_dir={out_dir}", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"reroll {command}: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("command", ["train", "sft"])
@pytest.mark.parametrize("out_dir", ["", "."])
def test_the_current_directory_is_never_a_run_by_accident(tmp_path, monkeypatch, capsys,
                                                           command, out_dir):
    """A user's files in the current directory (the issue's case: out_dir= empty wrote into
    it, overwrote init/ and checkpoints/latest and appended to metrics.jsonl)."""
    (tmp_path / "init").mkdir()
    (tmp_path / "init" / "model.safetensors").write_bytes(b"mine")
    (tmp_path / "metrics.jsonl").write_text('{"mine": 1}\n')
    before = files(tmp_path)
    monkeypatch.chdir(tmp_path)
    err = refused(capsys, command, out_dir)
    assert "current directory" in err or "out_dir is empty" in err, err
    assert files(tmp_path) == before


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_directory_of_foreign_files_is_refused_naming_some(tmp_path, capsys, command):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text('{"user": "settings"}')  # an unrelated config.json
    for i in range(7):
        (out / f"notes{i}.txt").write_text("x")
    before = files(out)
    err = refused(capsys, command, out)
    assert str(out) in err and "config.json" in err and "and 3 more" in err, err
    assert "did not write" in err, err
    assert files(out) == before and not (out / MARKER).exists()


@pytest.mark.parametrize("command", ["train", "sft"])
def test_out_dir_that_is_a_file_is_refused(tmp_path, capsys, command):
    f = tmp_path / "afile"
    f.write_text("x")
    err = refused(capsys, command, f)
    assert f"{str(f)!r} is a file" in err, err
    assert f.read_text() == "x"


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_read_only_out_dir_is_a_clear_error(tmp_path, monkeypatch, capsys, command):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if os.geteuid() == 0:  # root writes anywhere: the directory refuses as a read-only one
        import errno
        import pathlib

        real = pathlib.Path.mkdir

        def mkdir(self, *a, **k):
            if self.parent == parent:
                raise PermissionError(errno.EACCES, "Permission denied", str(self))
            return real(self, *a, **k)

        monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    try:
        err = refused(capsys, command, parent / "run")
        assert str(parent / "run") in err and "cannot be written" in err, err
    finally:
        parent.chmod(0o755)


def test_tilde_is_the_home_directory(tmp_path, monkeypatch, capsys):
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    config = work / "c.toml"
    config.write_text('out_dir = "~/x"\n')
    assert main(["sft", str(config), *SMALL]) == 0, capsys.readouterr().err
    assert (home / "x" / "model" / "config.json").is_file() and (home / "x" / MARKER).is_file()
    assert not (work / "~").exists()


def test_a_failed_start_leaves_a_directory_the_corrected_command_takes(tmp_path, capsys):
    """A failed start leaves the run directory marked as reroll's and empty of a run: the
    corrected command runs there."""
    out = tmp_path / "run"
    assert main(["train", "-", *SMALL, f"out_dir={out}", f"init={tmp_path / 'nowhere'}",
                 "--no-progress"]) == 2
    assert (out / MARKER).is_file() and not (out / "config.toml").exists()
    assert main(["train", "-", *SMALL, f"out_dir={out}", "--no-progress"]) == 0
