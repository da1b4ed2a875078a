"""The local runtime (default): everything in one process. The trainer runs in the caller's
thread, the rollout pipeline in an event-loop thread, the engine core in its own thread, and
verifiers in a pool of processes (`reward.workers`).

With ``max_staleness = 0`` the admission rule lets exactly one batch be generated per policy
version, so the same code is synchronous RL; with ``max_staleness > 0`` generation of the
next batches overlaps training.
"""

from __future__ import annotations

from pathlib import Path

from reroll import build, build_rollout
from reroll.config import RunConfig
from reroll.devices import resolved_engine_device
from reroll.runtime.compose import Components


def components(cfg: RunConfig, init_dir: Path, ckpt: Path | None, tok, task) -> Components:
    """Trainer, engine core and scorer, all in this process; ``tok`` and ``task`` are the
    run's, built once by the composition (`reroll.runtime.compose.run`)."""
    trainer = build.build_trainer(cfg, init_dir, ckpt)
    core = build.run_engine(trainer, tok, cfg)
    # held-out evaluation generates where the run's engine does (engine.device), not on the
    # trainer's device
    return Components(trainer=trainer, engine_core=core,
                      scorer=build_rollout.build_scorer(cfg, task),
                      eval_device=resolved_engine_device(cfg))
