"""A plug-in module an installed distribution declares in the ``reroll.plugins`` entry-point
group (`reroll.plugins.import_entry_points`) is imported inside Ray's actors too: a Ray run
whose verifier only that module registers scores it in a scoring actor, a process other than
the driver, without a ``plugins`` key."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[2]
MODULE = '''import os
from pathlib import Path

from reroll.verifiers import VERIFIERS, judged

MARKS = Path(os.environ["PLUGIN_MARKS"])
with open(MARKS / "imported", "a") as f:
    f.write(f"{os.getpid()}\\n")


@VERIFIERS.register("scored_where", cheap=True)
def scored_where():
    def verify(rollout, example):
        with open(MARKS / "scored", "a") as f:
            f.write(f"{os.getpid()}\\n")
        return judged("scored_where", 1.0, "scored")
    verify.name = "scored_where"
    return verify
'''


def _pids(path: Path) -> set[int]:
    return {int(x) for x in path.read_text().split()} if path.exists() else set()


def test_an_entry_point_plugin_is_imported_inside_a_ray_actor(tmp_path):
    site, marks, work = tmp_path / "site", tmp_path / "marks", tmp_path / "work"
    info = site / "where_scored-0.1.dist-info"  # as pip leaves an installed distribution
    for d in (info, marks, work):
        d.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: where-scored\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[reroll.plugins]\nwhere = where_scored\n")
    (site / "where_scored.py").write_text(MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)]),
           "PLUGIN_MARKS": str(marks), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("REROLL_PLUGINS", None)
    out = work / "run"
    args = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=20",
            "task.args.n_test=4", "rollout.group_size=2", "rollout.batch_groups=2",
            "rollout.max_new_tokens=3", "train.steps=1", "runtime.threads=1",
            "eval.n_examples=0", "log_every=1", "runtime.kind=ray", "runtime.scoring_workers=1",
            "reward.workers=0", "reward.inline=never", f"out_dir={out}",
            'reward.verifiers=[{name = "scored_where"}]', "--no-progress"]
    proc = subprocess.Popen([sys.executable, "-m", "reroll.cli", "train", "-", *args], cwd=work,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    scored, imported = _pids(marks / "scored"), _pids(marks / "imported")
    assert proc.pid in imported  # the driver, to check the config
    assert scored and proc.pid not in scored  # judged in the scoring actor alone ...
    assert scored <= imported  # ... which imported the module itself
    from reroll.runlog import read_metrics

    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1] and rows[0]["reward/mean"] == 1.0
    assert rows[0].get("reward/errors", 0) == 0
