"""The Python API (`reroll.train`, `reroll.sft`, `reroll.evaluate`): README's example as
written, `reroll.sft` and `reroll.evaluate` equal to `reroll sft` and `reroll eval`, a
reward that is a plain module function (scored in worker processes) and the config it
builds."""

import json
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
    warm, scores = scope["warm"], scope["scores"]
    assert warm.model_dir == Path("runs/api_sft/model") and len(warm.losses) == 20
    config = (tmp_path / "runs" / "api" / "config.toml").read_text()
    assert f'init = "{warm.model_dir}"' in config
    assert scores.checkpoint == Path("runs/api")  # its latest checkpoint, as reroll eval takes it
    assert scores.metrics["eval/greedy_score_errors"] == 0


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


SFT = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
       "task.args.n_test=8", "sft.steps=20", "sft.batch_size=8", "sft.warmup_steps=3",
       "sft.lr=3e-3", "reward.workers=0"]


def test_python_api_sft_is_reroll_sft(tmp_path):
    """`reroll.sft` runs what `reroll sft` runs: the same logged losses and the same saved
    model, byte for byte (one process, CPU, same seed: deterministic)."""
    from reroll.cli import main

    assert main(["sft", "-", *SFT, f"out_dir={tmp_path / 'cli'}"]) == 0
    result = reroll.sft(overrides=SFT, out_dir=str(tmp_path / "api"))
    assert result.run_dir == tmp_path / "api" and result.model_dir == tmp_path / "api" / "model"
    assert len(result.losses) == 20
    logged = {r["step"]: r["sft/loss"] for r in read_metrics(result.run_dir)}
    assert logged == {10: result.losses[9], 20: result.losses[19]}
    assert logged == {r["step"]: r["sft/loss"] for r in read_metrics(tmp_path / "cli")}
    for name in ("model.safetensors", "config.json"):
        assert (result.model_dir / name).read_bytes() == \
            (tmp_path / "cli" / "model" / name).read_bytes()
    with pytest.raises(ConfigError, match="already"):  # the CLI's run-directory rule
        reroll.sft(overrides=SFT, out_dir=str(tmp_path / "api"))


def test_python_api_evaluate_counts_what_the_reward_says(tmp_path):
    """`reroll.evaluate` on rows with a reward callable: a reward that ignores the completion
    (1 when the answer starts with "1") makes greedy accuracy and pass@k the share of the
    held-out rows whose answer starts with "1", counted here from the task's own split;
    the numbers equal `reroll eval`'s on the same config."""
    from reroll import build
    from reroll.cli import main

    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
    sized = ["model.max_position=32", "rollout.max_new_tokens=3", "eval.k=2",
             "task.args.test_fraction=0.3"]
    warm = reroll.sft(dataset=rows, out_dir=str(tmp_path / "warm"), overrides=sized,
                      task={"args": {"demo_field": "answer"}}, sft={"steps": 2})

    def first_is_one(prompts, completions, answer, **fields):
        return [float(a.startswith("1")) for a in answer]

    out = tmp_path / "eval.json"
    result = reroll.evaluate(reward=first_is_one, dataset=rows, checkpoint=warm.model_dir,
                             overrides=sized, output=out, out_dir=str(tmp_path / "ev"))
    cfg = run_config(None, dataset=rows, overrides=sized, out_dir=str(tmp_path / "warm"))
    held_out = build.build_task(cfg).test[:cfg.eval.n_examples]
    share = sum(ex.answer.startswith("1") for ex in held_out) / len(held_out)
    assert 0 < share < 1 and result.metrics["eval/n_examples"] == len(held_out)
    assert result.metrics["eval/greedy_accuracy"] == share
    assert result.metrics["eval/pass@2"] == share
    assert json.loads(out.read_text()) == {**result.metrics, "checkpoint": str(warm.model_dir)}
    assert not (tmp_path / "ev").exists()  # evaluation writes no run directory
    # `reroll eval` on the same rows (the file sft wrote) with a verifier by name
    data = str(tmp_path / "warm.dataset.jsonl")
    assert main(["eval", "-", *sized, "task.name=jsonl", f"task.args.path={data}",
                 "--checkpoint", str(warm.model_dir), "--output", str(tmp_path / "cli.json")]) == 0
    api = reroll.evaluate(dataset=data, checkpoint=warm.model_dir, overrides=sized)
    assert json.loads((tmp_path / "cli.json").read_text()) == \
        {**api.metrics, "checkpoint": str(warm.model_dir)}
