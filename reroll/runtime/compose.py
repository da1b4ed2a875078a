"""The composition both runtimes share: given where the trainer, the engine core and the
scorer run, build the rest (task, prompt stream, scheduler, workflow, rollout pipeline,
weight transport, evaluator) and run the one loop.

`reroll.runtime.local` and `reroll.runtime.ray` differ only in the components they hand in.
Holds no algorithm logic; the loop (`reroll.loop`) never sees any of this wiring.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reroll import build, build_rollout, timeline
from reroll.config import RunConfig
from reroll.control.pruners import generated_group_size
from reroll.control.rollouts import Rollouts
from reroll.control.scheduler import Scheduler
from reroll.control.wiring import build_control
from reroll.memory import frozen_heap
from reroll.replay.stage import build_replay, fresh_groups
from reroll.runlog import RunDir
from reroll.runtime.host import RolloutSource
from reroll.trainer import checkpoint
from reroll.trainer.step import TrainerHandle


@dataclass
class Components:
    """What a runtime builds for where it runs, from the config and what the composition
    built once for every side (the tokenizer and the task)."""

    trainer: TrainerHandle
    engine_core: Any  # a `reroll.engine.EngineCore`, or an asynchronous `Engine` (remote)
    scorer: Any  # a scorer (submit / combine / close)
    eval_device: str | None = None  # in-loop evaluation's engine (None: the policy's device)


class Transport:
    """Moves the trainer's weights to the engines, by version. Where the engine keeps what
    it holds and merges LoRA adapters itself (``partial``), the first publish sends every
    tensor, a LoRA policy's in adapter form (the targeted modules' frozen bases and their
    adapters), and later ones only what training changes (`TrainerHandle.weights`: the
    adapters, A, B and scale), so no engine ever starts from base weights it was not sent.
    Otherwise (a server) every publish sends every tensor, merged. A Transport lives as
    long as its engine: a resumed run builds both afresh, and its first publish is full
    again."""

    def __init__(self, trainer: TrainerHandle, source: RolloutSource, partial: bool = True):
        self.trainer, self.source, self.partial = trainer, source, partial
        self.sent = False  # a full publish reached the engine

    def weights(self) -> Any:
        """What the next publish sends (see the class docstring)."""
        if not self.partial:
            return self.trainer.weights()
        return self.trainer.weights(trained_only=self.sent, adapters=True)

    def publish(self, version: int) -> None:
        self.source.publish(self.weights(), version)
        self.sent = True


def run(cfg: RunConfig, rd: RunDir, ckpt: Path | None, init_dir: Path, build_components,
        progress: bool = True, stop=None) -> dict:
    """Build everything, run `reroll.loop.run`, and close what was built in reverse order.
    The tokenizer and the task are built once, here, and handed to ``build_components``
    (``(cfg, init_dir, ckpt, tok, task) -> Components``)."""
    from reroll.engine import ENGINES
    from reroll.loop import run as run_loop
    from reroll.trainer.evaluate import HeldOutEval
    from reroll.workflows import WORKFLOWS

    state = checkpoint.read_state(ckpt) if ckpt else {}
    with contextlib.ExitStack() as done:
        tok = build.load_tokenizer(init_dir)
        task = build.build_task(cfg, tok, init_dir)
        build_rollout.check_sandbox(cfg, task)
        parts: Components = build_components(cfg, init_dir, ckpt, tok, task)
        done.callback(parts.trainer.close)
        done.callback(parts.scorer.close)
        combine = parts.scorer.combine
        control, prompts = build_control(
            cfg, task.train, lambda x: None if x.failed else combine(x.scores), state,
            marker=build_rollout.answer_marker_ids(cfg, tok, task))
        r = cfg.rollout
        replay = build_replay(cfg.replay, cfg.rollout, control.success, state,
                              seed=cfg.train.seed)

        def prepare(rollouts) -> None:  # per-sample decisions, then drafts
            control.prepare(rollouts)
            if replay is not None:
                replay.prepare(rollouts)

        start = build_rollout.group_starter(cfg, tok, prepare)
        sched = Scheduler(prompts, start,
                          group_size=generated_group_size(cfg.control, cfg.rollout),
                          batch_groups=fresh_groups(cfg.rollout, cfg.replay),
                          max_staleness=cfg.runtime.max_staleness,
                          overprovision=cfg.runtime.overprovision,
                          filters=build_rollout.build_filters(cfg, combine), controller=control,
                          replay=replay, max_errors=cfg.reward.max_errors)
        rerun = sched.restore(checkpoint.read_groups(ckpt), state["counters"]) if ckpt else []
        control.resume(rerun)
        workflow = WORKFLOWS.get(r.workflow)
        shaping = build_rollout.build_shaping(cfg)

        def make() -> Rollouts:
            from reroll.engine import as_engine

            engine = as_engine(parts.engine_core, build.engine_threads(cfg))
            ctx = build_rollout.episode_context(cfg, tok, engine, parts.scorer, shaping)
            ctx.grow = sched.grow if control.adaptive else None
            return Rollouts(sched, workflow, ctx, partial_rollouts=cfg.runtime.partial_rollouts)

        # from the first batch's generation (it starts as the source does) to the last step
        done.enter_context(timeline.recording(
            timeline.next_path(rd.path) if cfg.log.timeline else None))
        source = RolloutSource(make, rerun)
        done.callback(source.close)
        held_out = HeldOutEval(cfg, tok, task, parts.scorer, device=parts.eval_device, k=1)

        def evaluator() -> dict[str, float]:
            return held_out(parts.trainer.policy())

        # a server loads whole merged models: it gets every tensor at each publish
        partial = not ENGINES.trait(cfg.engine.name, "remote", False)
        rd.commit()  # everything is built: from now on the directory holds this run
        # set-up's objects are not scanned again until the run ends
        done.enter_context(frozen_heap(cfg.runtime.gc_freeze))
        return run_loop(build.cadence(cfg), trainer=parts.trainer, source=source,
                        transport=Transport(parts.trainer, source, partial=partial),
                        run_dir=rd,
                        evaluate=evaluator, start_step=state.get("step", 0), progress=progress,
                        stop=stop)
