"""The runs that are not RL: a supervised warm start (`run_sft`) and a held-out evaluation of a
checkpoint (`run_eval`), as functions of a config. `reroll sft` and `reroll eval`
(`reroll.cli`) and the Python API (`reroll.sft`, `reroll.evaluate` in `reroll.api`) both
call them, so the checks, the run directory and the numbers are one code path.

Owns checking the config, the sft run directory, loading what a checkpoint path names and
assembling the evaluation; knows nothing of argument parsing, printing or exit codes.
"""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from reroll.config import RunConfig


@dataclass
class SFTResult:
    """What an sft run leaves: its run directory, the saved model folder (the start of an RL
    run: ``init = model_dir``) and the loss of each step trained in this call (empty when a
    resumed run had nothing left)."""

    run_dir: Path
    model_dir: Path
    losses: list[float]


def run_sft(cfg: RunConfig, *, resume: bool = False, signals: bool = False) -> SFTResult:
    """Check ``cfg`` and run `reroll.trainer.sft.sft` on its task's demonstrations in
    ``cfg.out_dir`` (a new run directory, or the one resumed from its latest checkpoint),
    then save the model in model.dtype to OUT_DIR/model (a LoRA policy merged into a plain
    model). With ``signals`` the first SIGINT/SIGTERM stops at the next step with a
    checkpoint written and raises `reroll.stopping.Stopped`."""
    import torch

    from reroll import build, build_rollout
    from reroll.config_checks import validate
    from reroll.lora import is_lora, plain_copy
    from reroll.runlog import RunDir
    from reroll.stopping import StopFlag, stop_on_signals
    from reroll.trainer import checkpoint
    from reroll.trainer.precision import autocast_dtype
    from reroll.trainer.sft import save_model, sft

    validate(cfg)
    build.prepare_process(cfg)
    torch.manual_seed(cfg.train.seed)
    rd = RunDir(cfg, resume=resume)
    try:
        ckpt = checkpoint.latest(rd.path) if resume else None
        if resume:  # rows after the checkpoint (all of them if none) are redone
            rd.truncate(checkpoint.read_state(ckpt)["step"] if ckpt else 0)
        # float32 master weights and AdamW state; bf16 autocast where model.dtype = bfloat16;
        # with [lora], adapters over the starting model's frozen weights
        model, tok = build.load_policy(cfg, build.model_dir(cfg, rd.path), ckpt)
        task = build.build_task(cfg)
        rd.commit()

        def save(step, opt, sched, extras):
            checkpoint.save(rd.path, step, model, tok, opt, {"kind": "sft"},
                            lr_scheduler=sched, extras=extras)

        with stop_on_signals(StopFlag()) if signals else nullcontext(None) as flag:
            losses = sft(model, tok, task.train, build_rollout.encode_prompt(tok, cfg.task.chat),
                         steps=cfg.sft.steps, lr=cfg.sft.lr, batch_size=cfg.sft.batch_size,
                         seed=cfg.train.seed, schedule=cfg.sft.schedule,
                         warmup_steps=cfg.sft.warmup_steps, demos=build_rollout.demo_turns(cfg),
                         encode_observation=build_rollout.encode_observation(tok, cfg.task.chat),
                         autocast_dtype=autocast_dtype(cfg.model.dtype),
                         logprob_chunk=cfg.train.logprob_chunk,
                         fused_optimizer=cfg.train.fused_optimizer,
                         micro_tokens=cfg.sft.micro_batch_tokens,
                         log=lambda s, m: rd.log(s, m) if s % 10 == 0 or s == cfg.sft.steps
                         else None, ckpt_every=cfg.ckpt_every, save=save, resume=ckpt,
                         stop=flag)
        # saved in model.dtype (weights and config.json), as a model loaded in it would be;
        # a LoRA policy merged into a plain model, so that RL starts from it like any other
        dtype = getattr(torch, cfg.model.dtype)
        if is_lora(model):
            model = plain_copy(model, next(model.parameters()).device, dtype,
                               build.module_copy)
        out = save_model(model.to(dtype=dtype), tok, rd.path / "model")
    finally:
        rd.close()
    return SFTResult(run_dir=rd.path, model_dir=Path(out), losses=list(losses))


def run_eval(cfg: RunConfig, checkpoint: str | Path,
             output: str | Path | None = None) -> dict[str, Any]:
    """Check ``cfg``, then greedy accuracy and pass@k of what ``checkpoint`` names (a model
    or sft folder, a checkpoint, or a run directory: its latest checkpoint) on the first
    ``eval.n_examples`` of its task's test split: `reroll.trainer.evaluate.HeldOutEval`'s
    metrics and ``"checkpoint"``, also written as JSON to ``output`` (checked writable
    before the evaluation starts)."""
    from reroll import build
    from reroll.config import ConfigError
    from reroll.config_checks import validate
    from reroll.trainer.evaluate import HeldOutEval

    try:  # the checkpoint's context, not the config's model (a missing one is named below)
        model_dir = build.weights_dir(str(checkpoint))
    except (FileNotFoundError, OSError):
        model_dir = None
    validate(cfg, model_dir)
    build.prepare_process(cfg)
    if output:  # fail now, not after a long evaluation
        out = Path(output)
        if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
            raise ConfigError(f"--output {str(out)!r}: cannot write a file there (its "
                              f"directory must exist and be writable)")
    model, tok = load_checkpoint(str(checkpoint), cfg)
    held_out = HeldOutEval(cfg, tok, build.build_task(cfg))
    try:
        m = held_out(model)
    finally:
        held_out.close()
    m["checkpoint"] = str(checkpoint)
    if output:
        Path(output).write_text(json.dumps(m, indent=1))
    return m


def load_checkpoint(path: str, cfg: RunConfig, tries: int = 3):
    """(model, tokenizer) of what ``path`` names (`reroll.build.weights_dir`), a checkpoint's
    only when it is whole. Training may rotate a checkpoint away while it is read: through a
    run directory the read is retried on its new latest checkpoint; a checkpoint named
    itself is refused, saying so."""
    from reroll import build
    from reroll.config import ConfigError
    from reroll.trainer.checkpoint import check_whole

    attempt = 0
    while True:
        src = build.weights_dir(path)
        try:
            check_whole(src)
            return build.load_model(src, cfg)
        except (ConfigError, OSError):
            if src.is_dir() and (src / "config.json").is_file():
                raise  # still there: damaged, not rotated
            attempt += 1
            if Path(path) in (src, src.parent) or attempt == tries:
                raise ConfigError(f"checkpoint {src.parent} was removed while it was read "
                                  f"(training keeps only its newest checkpoints); evaluate "
                                  f"the run directory to take its latest, or a copy") from None
