"""The Python API: `train` runs RL from a script the way TRL's ``GRPOTrainer(model,
reward_funcs, train_dataset)`` is used: a config (a TOML path, a `RunConfig` or nothing),
a reward (a callable with TRL's reward-function contract, or a verifier's name) and a
dataset (rows as dicts, a JSONL or Parquet path, or a ``datasets.Dataset``). It turns them
into an ordinary config and calls the composition root (`reroll.runtime.train`), so the
checks, the run directory and the checkpoints are the CLI's. `sft` and `evaluate` do the
same for `reroll sft` and `reroll eval`, through the functions those commands call
(`reroll.offline`).

Owns only that translation; knows nothing of how a run runs.
"""

from __future__ import annotations

import json
import tempfile
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reroll.config import RunConfig, apply_override, build, load_config, merge, to_dict
from reroll.offline import SFTResult, run_eval, run_sft

__all__ = ["EvalResult", "Result", "SFTResult", "evaluate", "run_config", "sft", "train"]

_IN_PROCESS = types.SimpleNamespace()
"""Reward callables that cannot be imported by path (lambdas, closures): the ``python``
verifier finds them here as ``reroll.api:_IN_PROCESS.reward_N``, in this process only."""


@dataclass
class Result:
    """What `train` returns: the run directory and the last logged metrics."""

    run_dir: Path
    metrics: dict[str, float]


@dataclass
class EvalResult:
    """What `evaluate` returns: the checkpoint it evaluated and the numbers `reroll eval`
    prints (``eval/greedy_accuracy``, ``eval/pass@k``, ...)."""

    checkpoint: Path
    metrics: dict[str, float]


def _config(config: str | Path | RunConfig | None, overrides: Iterable[str],
            sections: dict[str, Any]) -> dict[str, Any]:
    if isinstance(config, RunConfig):
        data = to_dict(config)
        for item in overrides:
            apply_override(data, item)
    else:
        data = to_dict(load_config(config, list(overrides)))
    return merge(data, sections)


def _reward_spec(reward: str | Callable, data: dict[str, Any]) -> dict[str, Any]:
    """The verifier spec of ``reward``; a callable no other process can import makes the
    run score in this process (``reward.workers = 0``)."""
    if isinstance(reward, str):
        return {"name": reward, "weight": 1.0, "args": {}}
    if not callable(reward):
        raise TypeError(f"reroll: reward must be a callable or a verifier name, got "
                        f"{reward!r}")
    mod, qual = getattr(reward, "__module__", None), getattr(reward, "__qualname__", "")
    if mod and mod != "__main__" and "<" not in qual:
        return {"name": "python", "weight": 1.0, "args": {"fn": f"{mod}:{qual}"}}
    key = f"reward_{len(vars(_IN_PROCESS))}"
    setattr(_IN_PROCESS, key, reward)
    data.setdefault("reward", {})["workers"] = 0
    return {"name": "python", "weight": 1.0, "args": {"fn": f"reroll.api:_IN_PROCESS.{key}"}}


def _dataset_path(dataset: Any, out_dir: Path) -> Path:
    """A path to ``dataset``'s rows: its own when it is a file, else they are written beside
    the run directory, to OUT_DIR.dataset.jsonl (kept, so the run resumes on the same rows;
    the run directory itself holds only what the run writes)."""
    if isinstance(dataset, str | Path):
        return Path(dataset).expanduser().resolve()
    rows = dataset.to_list() if hasattr(dataset, "to_list") else list(dataset)
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise TypeError("reroll: dataset must be a path, a datasets.Dataset or a "
                        "non-empty list of dicts")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    path = (out_dir.parent / f"{out_dir.name}.dataset.jsonl").resolve()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _given_task_args(overrides: Iterable[str], sections: dict[str, Any]) -> dict[str, Any]:
    """The task arguments named in ``overrides`` and ``sections`` themselves."""
    given: dict[str, Any] = {}
    for item in overrides:
        apply_override(given, item)
    given = merge(given, {"task": sections.get("task") or {}})
    return dict(given.get("task", {}).get("args", {}))


def run_config(config: str | Path | RunConfig | None = None, *, reward: Any = None,
               dataset: Any = None, overrides: Iterable[str] = (), rows_dir: Path | None = None,
               **sections: Any) -> RunConfig:
    """The `RunConfig` `train` runs (not yet checked): ``config`` with ``overrides``
    (``"a.b=c"`` strings) applied, then ``sections`` (``train={"steps": 10}``,
    ``out_dir="runs/x"``), then the reward and dataset. The [reward] section's own keys go
    in ``overrides`` (``"reward.workers=0"``): ``reward`` is the reward itself. Rows given
    in memory are written beside the run directory, or in ``rows_dir`` when given. With a
    dataset, the task's arguments are the config's when its task is jsonl/parquet, else
    only those given here (``"task.args.test_fraction=0.3"``, ``task={"args":
    {"demo_field": "answer"}}`` for `sft`): another task's arguments do not apply."""
    data = _config(config, overrides, sections)
    if dataset is not None:
        out = Path(data["out_dir"]).expanduser()
        path = _dataset_path(dataset, out if rows_dir is None else Path(rows_dir) / out.name)
        task = data.setdefault("task", {})
        kind = "parquet" if path.suffix == ".parquet" else "jsonl"
        args = task.get("args", {}) if task.get("name") in ("jsonl", "parquet") else \
            _given_task_args(overrides, sections)
        task.update(name=kind, args={**args, "path": str(path)})
    if reward is not None:
        data.setdefault("reward", {})["verifiers"] = [_reward_spec(reward, data)]
    return build(RunConfig, data)


def train(config: str | Path | RunConfig | None = None, *, reward: Any = None,
          dataset: Any = None, overrides: Iterable[str] = (), resume: bool = False,
          progress: bool = False, **sections: Any) -> Result:
    """Run RL training (see `run_config` for the arguments) and return its `Result`. The
    config is checked before any work, as `reroll train` checks it."""
    from reroll.runtime import train as run

    cfg = run_config(config, reward=reward, dataset=dataset, overrides=overrides, **sections)
    metrics = run(cfg, resume=resume, progress=progress)
    return Result(run_dir=Path(cfg.out_dir).expanduser(), metrics=metrics)


def sft(config: str | Path | RunConfig | None = None, *, dataset: Any = None,
        overrides: Iterable[str] = (), resume: bool = False, **sections: Any) -> SFTResult:
    """A supervised warm start, as `reroll sft` runs it (`reroll.offline.run_sft`), on the
    task's demonstrations: with ``dataset``, the rows' ``task.args.demo_field`` (e.g.
    ``task={"args": {"demo_field": "answer"}}``). Returns the run directory, the saved
    model folder (``init=`` of a following `train`) and the losses."""
    cfg = run_config(config, dataset=dataset, overrides=overrides, **sections)
    return run_sft(cfg, resume=resume)


def evaluate(config: str | Path | RunConfig | None = None, *, checkpoint: str | Path,
             reward: Any = None, dataset: Any = None, overrides: Iterable[str] = (),
             output: str | Path | None = None, **sections: Any) -> EvalResult:
    """Greedy accuracy and pass@k of ``checkpoint`` (a run directory, checkpoint or model
    folder) on the held-out split of the config's task, as `reroll eval` computes them
    (`reroll.offline.run_eval`); with ``output``, also written there as JSON. A ``dataset``
    is split as `train` splits it (its ``test_fraction``), so a run's held-out rows are
    the ones evaluated; rows in memory go to a temporary file, removed afterwards."""
    with tempfile.TemporaryDirectory(prefix="reroll-eval-") as tmp:
        cfg = run_config(config, reward=reward, dataset=dataset, overrides=overrides,
                         rows_dir=Path(tmp), **sections)
        m = run_eval(cfg, checkpoint, output)
    return EvalResult(checkpoint=Path(m.pop("checkpoint")), metrics=m)
