"""`plugins = [...]`: docs/extending.md's components, saved as a module of the user's outside
the package, train from the CLI as written, named in the TOML or on the command line, also
when their verifier is scored in a spawned worker process."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from reroll.config import ConfigError

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
SMALL = ["model.max_position=32", "task.args.n_train=40", "task.args.n_test=8",
         "rollout.group_size=2", "rollout.batch_groups=2", "rollout.max_new_tokens=3",
         "train.steps=2", "runtime.threads=1", "log_every=1", "eval.n_examples=0"]


def _components(tmp_path: Path) -> None:
    """The doc's verifier, task, environment and workflow, in tmp_path/my_components.py."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    mine = [b for b in blocks if any(k in b for k in ("\"ends_with\"", "\"double\"", "\"echo\""))]
    assert len(mine) == 3
    (tmp_path / "my_components.py").write_text("\n\n".join(mine))


def _reroll(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # reroll itself; the plugin is in the cwd
    env.pop("REROLL_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "reroll.cli", "train", *args], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)


def test_plugin_from_the_toml_and_the_command_line(tmp_path):
    from reroll.runlog import read_metrics

    _components(tmp_path)
    toml = re.search(r"```toml\n# my_env.toml[^\n]*\n(.*?)```", DOC.read_text(), re.S)[1]
    (tmp_path / "my_env.toml").write_text(toml)
    env_run = _reroll(tmp_path, "my_env.toml", "task.args.digits=1", "reward.workers=0", *SMALL,
                      "--no-progress")
    assert env_run.returncode == 0, env_run.stderr[-3000:]
    # the task and the verifier of the module, the verifier scored in a worker process
    task_run = _reroll(tmp_path, "-", "plugins=[\"my_components\"]", "task.name=double",
                       "out_dir=runs/ext/task", 'reward.verifiers=[{name = "ends_with"}]',
                       "reward.workers=1", "reward.inline=never", *SMALL, "--no-progress")
    assert task_run.returncode == 0, task_run.stderr[-3000:]
    for run in ("env", "task"):
        rows = read_metrics(tmp_path / "runs" / "ext" / run)
        assert [r["step"] for r in rows] == [1, 2] and rows[-1]["pipeline/consumed"] == 4
        assert rows[-1].get("reward/errors", 0) == 0


def test_plugin_that_cannot_be_imported_is_a_config_error(tmp_path, monkeypatch):
    from reroll.config_checks import load_checked

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="plugins: cannot import 'no_such_module_here'"):
        load_checked(None, ['plugins=["no_such_module_here"]'])
