"""The Python API (`reroll.train`): README's example as written, a reward that is a plain
module function (scored in worker processes) and the config it builds."""

import re
from pathlib import Path

import pytest

import reroll
from reroll.api import run_config
from reroll.config import ConfigError
from reroll.runlog import read_metrics

README = Path(__file__).resolve().parents[1] / "README.md"
SMALL = {"model": {"max_position": 32}, "rollout": {"group_size": 2, "batch_groups": 2},
         "runtime": {"threads": 1}, "eval": {"n_examples": 0}, "log_every": 1}


def short(prompts, completions, answer, **fields):
    return [float(c.strip() == a) for c, a in zip(completions, answer)]


def test_readme_python_api_example(tmp_path, monkeypatch):
    block = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
                 if "reroll.train(" in b)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    result = scope["result"]
    assert result.run_dir == Path("runs/api")
    assert (tmp_path / "runs" / "api.dataset.jsonl").is_file()
    assert (tmp_path / "runs" / "api" / "checkpoints" / "latest").exists()
    assert "reward/mean" in result.metrics


def test_importable_reward_runs_in_worker_processes(tmp_path):
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(6) for b in range(6)]
    out = tmp_path / "run"
    cfg = run_config(None, reward=short, dataset=rows, out_dir=str(out),
                     task={"name": "jsonl", "args": {"prompt_field": "question"}},
                     train={"steps": 2}, overrides=["reward.workers=1"], **SMALL)
    assert cfg.reward.verifiers == [{"name": "python", "weight": 1.0,
                                     "args": {"fn": f"{__name__}:short"}}]
    assert cfg.task.args == {"prompt_field": "question", "path": str(tmp_path / "run.dataset.jsonl")}
    result = reroll.train(cfg)
    assert result.metrics.get("reward/errors", 0) == 0
    assert [r["step"] for r in read_metrics(out)] == [1, 2]


def test_bad_arguments_are_refused_before_work(tmp_path):
    with pytest.raises(TypeError, match="dataset must be"):
        run_config(None, dataset=[], out_dir=str(tmp_path / "a"))
    with pytest.raises(ConfigError, match="unknown verifier"):
        reroll.train(None, reward="no_such_verifier", out_dir=str(tmp_path / "b"))
