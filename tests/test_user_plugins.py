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


def _installed(site: Path, module_text: str) -> None:
    """A distribution installed in ``site`` as pip leaves one: its ``*.dist-info`` (METADATA,
    entry_points.txt declaring the module in the ``reroll.plugins`` group) and its module."""
    info = site / "my_reroll_components-0.3.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: my-reroll-components\n"
                                   "Version: 0.3\n")
    (info / "entry_points.txt").write_text("[reroll.plugins]\n"
                                           "components = my_installed_components\n")
    (site / "my_installed_components.py").write_text(module_text)


def _reroll_with(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`reroll train` in a fresh process whose sys.path holds ``site`` (so the test's own
    sys.path is untouched), run from ``cwd``, a directory without the module."""
    cwd.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}
    env.pop("REROLL_PLUGINS", None)
    return subprocess.run([sys.executable, "-m", "reroll.cli", "train", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=600)


def test_plugin_entry_point_of_an_installed_distribution(tmp_path):
    """The doc's components, installed as a distribution with a ``reroll.plugins`` entry
    point: no ``plugins`` key, its task and verifier are known when the config is checked
    and in the scoring worker process."""
    from reroll.runlog import read_metrics

    _components(tmp_path)
    _installed(tmp_path / "site", (tmp_path / "my_components.py").read_text())
    out = tmp_path / "work" / "runs" / "installed"
    run = _reroll_with(tmp_path / "site", tmp_path / "work", "-", "task.name=double",
                       f"out_dir={out}", 'reward.verifiers=[{name = "ends_with"}]',
                       "reward.workers=1", "reward.inline=never", *SMALL, "--no-progress")
    assert run.returncode == 0, run.stderr[-3000:]
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["pipeline/consumed"] == 4
    assert rows[-1].get("reward/errors", 0) == 0


def test_plugin_entry_point_that_fails_is_a_clear_error_before_any_work(tmp_path):
    _installed(tmp_path / "site", 'raise RuntimeError("no licence key found")\n')
    out = tmp_path / "work" / "runs" / "broken"
    run = _reroll_with(tmp_path / "site", tmp_path / "work", "-", f"out_dir={out}", *SMALL,
                       "--no-progress")
    assert run.returncode == 2, run.stderr[-3000:]
    assert run.stderr.strip().splitlines()[-1] == (
        "reroll train: error: plugin entry point 'components' = 'my_installed_components' "
        "(group 'reroll.plugins', distribution my-reroll-components 0.3) failed to import: "
        "RuntimeError: no licence key found")
    assert not out.exists()
