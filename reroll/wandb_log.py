"""Weights & Biases logging of a run's metrics rows (``log.wandb = true``), beside
metrics.jsonl and TensorBoard. Imported only when enabled; wandb is an optional extra
(`pip install reroll[wandb]`).

One W&B run per run directory: its id is kept in ``RUN/wandb_id``, so a resumed run
continues the same W&B run. W&B's steps only increase, so rows a resume redoes (steps after
its checkpoint) are skipped there; metrics.jsonl holds them. wandb's console capture is off:
stdout stays the command's result alone. Offline mode writes ``RUN/wandb/`` for a later
``wandb sync``. Knows nothing of what the metrics mean.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from reroll.config import RunConfig, to_dict


class WandbLogger:
    def __init__(self, cfg: RunConfig, run_dir: Path):
        import wandb

        id_file = Path(run_dir) / "wandb_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else ""
        if not run_id:
            run_id = uuid.uuid4().hex[:12]
            id_file.write_text(run_id + "\n")
        self.run = wandb.init(project=cfg.log.wandb_project, id=run_id, resume="allow",
                              name=Path(cfg.out_dir).name, dir=str(run_dir),
                              mode=cfg.log.wandb_mode, config=to_dict(cfg),
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
