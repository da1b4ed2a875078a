"""Weights & Biases logging of a run's metrics rows (``log.wandb = true``), beside
metrics.jsonl and TensorBoard. Imported only when enabled; wandb is an optional extra
(`pip install reroll[wandb]`).

One W&B run per run directory: its id is kept in ``RUN/wandb_id``, so a resumed run
continues the same W&B run. W&B's steps only increase, so rows a resume redoes (steps after
its checkpoint) are skipped there; metrics.jsonl holds them. wandb's console capture is off:
stdout stays the command's result alone. Offline mode writes ``RUN/wandb/`` for a later
``wandb sync``. Takes the ``[log]`` section and the run's name and settings as plain data;
knows nothing of what the metrics mean.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reroll.config import LogConfig


class WandbLogger:
    """``log``: the run's ``[log]`` section; ``name``: the W&B run's name; ``config``: the
    run's settings as W&B shows them (the whole config, as a dict)."""

    def __init__(self, log: LogConfig, name: str, config: dict[str, Any], run_dir: Path):
        import wandb

        id_file = Path(run_dir) / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else ""
        if not run_id:
            run_id = uuid.uuid4().hex[:12]
            id_file.write_text(run_id + "\n")
        self.run = wandb.init(project=log.wandb_project, id=run_id, resume="allow",
                              name=name, dir=str(run_dir), mode=log.wandb_mode,
                              config=config,
                              settings=wandb.Settings(console="off", silent=True))
        self.last_step = -1

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step <= self.last_step:
            return
        self.run.log({k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                     step=step)
        self.last_step = step

    def close(self) -> None:
        self.run.finish()
