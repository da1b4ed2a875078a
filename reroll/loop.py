"""The RL loop, written once: take complete groups from the runtime, update the policy,
publish the new weights, log, checkpoint. Synchronous RL is ``runtime.max_staleness = 0``
of this same loop (the admission rule then lets exactly one batch be generated per version).

Holds no algorithm logic: advantages and losses are `reroll.algo`, scheduling is
`reroll.control`, generation is `reroll.engine`, where things run is `reroll.runtime`.
"""

from __future__ import annotations

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
from reroll.trainer.metrics import batch_metrics, progress_bar
from reroll.trainer.step import Trainer


def train(cfg: RunConfig, resume: bool = False, progress: bool = True) -> dict:
    """Run RL training as configured; returns the last logged metrics."""
    from reroll.algo import build_objective

    build.set_threads(cfg)
    torch.manual_seed(cfg.train.seed)
    rd = RunDir(cfg, resume=resume)
    ckpt = checkpoint.latest(rd.path) if resume else None
    init_dir = build.model_dir(cfg, rd.path)
    model, tok = build.load_model(ckpt / "model" if ckpt else init_dir, cfg)
    objective = build_objective(cfg.algo)
    ref = build.load_model(init_dir, cfg)[0].eval() if objective.needs_ref else None
    trainer = Trainer(model, objective, pad_id=tok.pad_token_id, lr=cfg.train.lr,
                      weight_decay=cfg.train.weight_decay,
                      warmup_steps=cfg.train.warmup_steps, grad_clip=cfg.train.grad_clip,
                      minibatches=cfg.train.minibatches, micro_batch=cfg.train.micro_batch,
                      temperature=cfg.rollout.temperature, ref_model=ref)
    state, buffered = checkpoint.load_state(ckpt, trainer.opt, trainer.sched) if ckpt else ({}, [])
    rd.truncate(state.get("step", 0))
    trainer.version = state.get("version", 0)
    task = build.build_task(cfg)
    prompts = PromptStream(task.train, cfg.train.seed, **state.get("prompts", {}))
    scorer = build.build_scorer(cfg, task)
    engine = build.build_engine(model, tok, cfg, trainer.version, init_dir)
    sched = Scheduler(engine, scorer, prompts,
                      build.encode_prompt(tok), build.sampling_params(cfg, tok),
                      group_size=cfg.rollout.group_size, batch_groups=cfg.rollout.batch_groups,
                      max_staleness=cfg.runtime.max_staleness,
                      overprovision=cfg.runtime.overprovision,
                      partial_rollouts=cfg.runtime.partial_rollouts,
                      filters=build.build_filters(cfg), seed=cfg.train.seed,
                      shape_reward=build.build_shaping(cfg))
    if buffered or state:
        sched.restore(buffered, state["counters"])
    runtime = LocalRuntime(sched).start()  # drives local or Ray engines alike
    step, last = state.get("step", 0), {}
    bar = progress_bar(cfg.train.steps, step, enabled=progress)
    try:
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
                save_checkpoint(rd.path, step, model, tok, trainer, runtime)
            runtime.publish({k: v.detach().clone() for k, v in model.state_dict().items()},
                            trainer.version)
            gen1 = runtime.call(lambda s: (dict(s.time), s.engine.stats(), s.counters(),
                                           dict(s.score_errors)))
            metrics.update(batch_metrics(groups, gen0, gen1, wait_s=t1 - t0, train_s=t2 - t1,
                                         step_s=time.perf_counter() - t0))
            if cfg.eval.every and step % cfg.eval.every == 0:
                from reroll.trainer.evaluate import evaluate

                metrics.update(evaluate(model, tok, task.test[: cfg.eval.n_examples], scorer,
                                        build.encode_prompt(tok), cfg, k=1))
            if step % cfg.log_every == 0 or step == cfg.train.steps:
                rd.log(step, metrics)
            last = metrics
            bar.update(step, metrics)
    finally:
        bar.close()
        runtime.stop()
        scorer.close()
        if hasattr(engine, "shutdown"):
            engine.shutdown()
        rd.close()
    return last


def save_checkpoint(run_dir: Path, step: int, model, tok, trainer: Trainer, runtime) -> Path:
    """Weights, optimiser, RNG, data cursor and every unconsumed group, captured while the
    generation thread is paused so that nothing is lost or counted twice on resume."""

    def capture(s: Scheduler):
        return s.snapshot(), {"prompts": s.prompts.state(), "counters": s.counters(),
                              "version": trainer.version}

    groups, state = runtime.call(capture)
    return checkpoint.save(run_dir, step, model, tok, trainer.opt, state, groups,
                           lr_scheduler=trainer.sched)
