"""Where things run, and the composition root: `train` picks the runtime named by
``runtime.kind`` (local, or ray: imported only then), which builds the components for where
they run and hands them to the one loop (`reroll.loop`)."""

from __future__ import annotations

import importlib

from reroll.config import RunConfig

RUNTIMES = {"local": "reroll.runtime.local", "ray": "reroll.runtime.ray"}


def train(cfg: RunConfig, resume: bool = False, progress: bool = True, stop=None) -> dict:
    """Run RL training as configured; returns the last logged metrics. ``stop``: a
    `reroll.stopping.StopFlag` the loop checks between steps. The config is checked first
    (`reroll.config_checks.validate`): a bad one raises `ConfigError` before any work."""
    import torch

    from reroll import build
    from reroll.config_checks import validate
    from reroll.runlog import RunDir
    from reroll.runtime.compose import run
    from reroll.trainer import checkpoint

    validate(cfg)
    build.prepare_process(cfg)
    torch.manual_seed(cfg.train.seed)
    runtime = importlib.import_module(RUNTIMES[cfg.runtime.kind])
    rd = RunDir(cfg, resume=resume)
    try:
        ckpt = checkpoint.latest(rd.path) if resume else None
        init_dir = build.model_dir(cfg, rd.path)
        if resume:  # rows after the checkpoint (all of them if none was written) are redone
            rd.truncate(checkpoint.read_state(ckpt).get("step", 0) if ckpt else 0)
        return run(cfg, rd, ckpt, init_dir, runtime.components, progress=progress, stop=stop)
    finally:
        rd.close()
