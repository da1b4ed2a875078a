"""The Python API: `train` runs RL from a script the way TRL's ``GRPOTrainer(model,
reward_funcs, train_dataset)`` is used: a config (a TOML path, a `RunConfig` or nothing),
a reward (a callable with TRL's reward-function contract, or a verifier's name) and a
dataset (rows as dicts, a JSONL or Parquet path, or a ``datasets.Dataset``). It turns them
into an ordinary config and calls the composition root (`reroll.runtime.train`), so the
checks, the run directory and the checkpoints are the CLI's.

Owns only that translation; knows nothing of how a run runs.
"""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reroll.config import RunConfig, apply_override, build, load_config, merge, to_dict

_IN_PROCESS = types.SimpleNamespace()
"""Reward callables that cannot be imported by path (lambdas, closures): the ``python``
verifier finds them here as ``reroll.api:_IN_PROCESS.reward_N``, in this process only."""


@dataclass
class Result:
    """What `train` returns: the run directory and the last logged metrics."""

    run_dir: Path
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
        raise TypeError(f"reroll.train: reward must be a callable or a verifier name, got "
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
        raise TypeError("reroll.train: dataset must be a path, a datasets.Dataset or a "
                        "non-empty list of dicts")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    path = (out_dir.parent / f"{out_dir.name}.dataset.jsonl").resolve()
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_config(config: str | Path | RunConfig | None = None, *, reward: Any = None,
               dataset: Any = None, overrides: Iterable[str] = (), **sections: Any) -> RunConfig:
    """The `RunConfig` `train` runs (not yet checked): ``config`` with ``overrides``
    (``"a.b=c"`` strings) applied, then ``sections`` (``train={"steps": 10}``,
    ``out_dir="runs/x"``), then the reward and dataset. The [reward] section's own keys go
    in ``overrides`` (``"reward.workers=0"``): ``reward`` is the reward itself."""
    data = _config(config, overrides, sections)
    if dataset is not None:
        path = _dataset_path(dataset, Path(data["out_dir"]).expanduser())
        task = data.setdefault("task", {})
        kind = "parquet" if path.suffix == ".parquet" else "jsonl"
        args = task.get("args", {}) if task.get("name") in ("jsonl", "parquet") else {}
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
