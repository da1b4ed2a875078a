"""The RL loop, written once: take complete groups from the runtime, update the policy,
publish the new weights, log, checkpoint. Synchronous RL is ``runtime.max_staleness = 0``
of this same loop (the admission rule then lets exactly one batch be generated per version).

Holds no algorithm logic: advantages and losses are `reroll.algo`, scheduling is
`reroll.control`, generation is `reroll.engine`, where things run is `reroll.runtime`. The
trainer is any `TrainerHandle` (a `Trainer` here, or a Ray actor's proxy); `reroll.build`
alone decides which from `runtime.kind`.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import torch

from reroll import build
from reroll.config import RunConfig
from reroll.control.prompts import PromptStream
from reroll.control.scheduler import Scheduler
from reroll.runlog import RunDir
from reroll.runtime.local import LocalRuntime
from reroll.trainer import checkpoint
from reroll.trainer.evaluate import evaluate
from reroll.trainer.metrics import batch_metrics, progress_bar
from reroll.trainer.step import TrainerHandle


def train(cfg: RunConfig, resume: bool = False, progress: bool = True) -> dict:
    """Run RL training as configured; returns the last logged metrics."""
    build.set_threads(cfg)
    torch.manual_seed(cfg.train.seed)
    with contextlib.ExitStack() as done:  # closes whatever was built, in reverse order
        rd = RunDir(cfg, resume=resume)
        done.callback(rd.close)
        ckpt = checkpoint.latest(rd.path) if resume else None
        init_dir = build.model_dir(cfg, rd.path)
        trainer = build.build_trainer_handle(cfg, init_dir, ckpt)  # here, or a Ray actor
        done.callback(trainer.close)
        state = checkpoint.read_state(ckpt) if ckpt else {}
        rd.truncate(state.get("step", 0))
        tok = build.load_tokenizer(init_dir)
        task = build.build_task(cfg)
        prompts = PromptStream(task.train, cfg.train.seed, **state.get("prompts", {}))
        scorer = build.build_scorer(cfg, task)
        done.callback(scorer.close)
        engine = build.build_engine(None, tok, cfg, trainer.version, init_dir,
                                    weights=trainer.weights())
        if hasattr(engine, "shutdown"):
            done.callback(engine.shutdown)
        sched = Scheduler(engine, scorer, prompts,
                          build.encode_prompt(tok), build.sampling_params(cfg, tok),
                          group_size=cfg.rollout.group_size,
                          batch_groups=cfg.rollout.batch_groups,
                          max_staleness=cfg.runtime.max_staleness,
                          overprovision=cfg.runtime.overprovision,
                          partial_rollouts=cfg.runtime.partial_rollouts,
                          filters=build.build_filters(cfg), seed=cfg.train.seed,
                          shape_reward=build.build_shaping(cfg))
        if ckpt:
            sched.restore(checkpoint.read_groups(ckpt), state["counters"])
        runtime = LocalRuntime(sched).start()  # drives local or Ray engines alike
        done.callback(runtime.stop)
        step, last = state.get("step", 0), {}
        bar = progress_bar(cfg.train.steps, step, enabled=progress)
        done.callback(bar.close)
        if cfg.eval.every and step == 0:  # the starting point of the accuracy curve
            rd.log(0, evaluate(trainer.policy(), tok, task.test[: cfg.eval.n_examples], scorer,
                               build.encode_prompt(tok), cfg, k=1))
        while step < cfg.train.steps:
            t0 = time.perf_counter()
            gen0 = runtime.call(lambda s: (dict(s.time), s.engine.stats()))
            groups = runtime.next_batch(cfg.rollout.batch_groups, trainer.version)
            t1 = time.perf_counter()
            metrics = trainer.step(groups)
            t2 = time.perf_counter()
            step += 1
            if cfg.record_every and step % cfg.record_every == 0:
                rd.record(step, groups)
            if step % cfg.ckpt_every == 0 or step == cfg.train.steps:
                # before publishing: with max_staleness = 0 nothing is in flight now
                save_checkpoint(rd.path, step, trainer, runtime)
            runtime.publish(trainer.weights(), trainer.version)
            gen1 = runtime.call(lambda s: (dict(s.time), s.engine.stats(), s.counters(),
                                           dict(s.score_errors)))
            metrics.update(batch_metrics(groups, gen0, gen1, wait_s=t1 - t0, train_s=t2 - t1,
                                         step_s=time.perf_counter() - t0))
            if cfg.eval.every and step % cfg.eval.every == 0:
                metrics.update(evaluate(trainer.policy(), tok, task.test[: cfg.eval.n_examples],
                                        scorer, build.encode_prompt(tok), cfg, k=1))
            if step % cfg.log_every == 0 or step == cfg.train.steps:
                rd.log(step, metrics)
            last = metrics
            bar.update(step, metrics)
    return last


def save_checkpoint(run_dir: Path, step: int, trainer: TrainerHandle, runtime) -> Path:
    """Weights, optimiser, RNG, data cursor and every unconsumed group, captured while the
    generation thread is paused so that nothing is lost or counted twice on resume."""

    def capture(s: Scheduler):
        return s.snapshot(), {"prompts": s.prompts.state(), "counters": s.counters(),
                              "version": trainer.version}

    groups, state = runtime.call(capture)
    return trainer.save_checkpoint(run_dir, step, state, groups)
