"""The custom workflow and environment of docs/extending.md run as written."""

import re
from pathlib import Path

from reroll.config_checks import load_checked
from reroll.runlog import read_metrics
from reroll.runtime import train

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"


def test_the_readme_workflow_and_environment_train(tmp_path):
    block = next(b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
                 if "best_of_two" in b)
    exec(compile(block, "docs/extending.md", "exec"), {})
    small = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
             "task.args.n_test=8", "rollout.group_size=2", "rollout.batch_groups=2",
             "rollout.max_new_tokens=3", "reward.workers=0", "log_every=1",
             "runtime.threads=1", "train.steps=2"]
    train(load_checked(None, small + [f"out_dir={tmp_path / 'wf'}",
                                      "rollout.workflow=best_of_two"]), progress=False)
    train(load_checked(None, small + [f"out_dir={tmp_path / 'env'}", "rollout.workflow=multi_turn",
                                      "rollout.env=echo", "rollout.env_args={word=\"1\"}"]),
          progress=False)
    for run in ("wf", "env"):
        rows = read_metrics(tmp_path / run)
        assert [r["step"] for r in rows] == [1, 2] and rows[-1]["pipeline/consumed"] == 4
