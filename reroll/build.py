"""Wiring: turn a RunConfig into components (model, tokenizer, task, reward, engine, objective,
trainer, scheduler). Looks things up in registries; holds no algorithm logic and no loop.

`runtime.kind` is decided here and nowhere else: `build_engine` and `build_trainer_handle`
return the local components or their Ray counterparts behind the same interfaces.
"""

from __future__ import annotations

import copy
from pathlib import Path

from reroll.config import RunConfig
from reroll.rollout import SamplingParams


def set_threads(cfg: RunConfig) -> None:
    import torch

    torch.set_num_threads(max(1, cfg.runtime.threads))


def quiet_transformers() -> None:
    from transformers.utils import logging as tlog

    tlog.disable_progress_bar()
    tlog.set_verbosity_error()


def model_dir(cfg: RunConfig, run_dir: Path) -> Path:
    """Where the starting weights come from: `init`, else `model.path`, else a tiny model
    built from `model.*` into RUN/init (random init, seeded)."""
    from reroll.models import build_tiny

    if cfg.init:
        p = Path(cfg.init)
        if (p / "model" / "config.json").is_file():  # an sft output dir or a checkpoint dir
            p = p / "model"
        return p
    if cfg.model.path:
        return Path(cfg.model.path)
    target = run_dir / "init"
    if not (target / "config.json").is_file():
        quiet_transformers()
        build_tiny(cfg.model, target, seed=cfg.train.seed)
    return target


def load_model(path: Path, cfg: RunConfig):
    from reroll.models import load

    quiet_transformers()
    model, tok = load(path, cfg.model.dtype)
    return model, tok


def load_tokenizer(path: Path):
    """The tokenizer of a model directory alone (the driver needs no model to encode)."""
    from transformers import AutoTokenizer

    quiet_transformers()
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:  # as reroll.models.load does
        tok.pad_token = tok.eos_token
    return tok


def build_trainer(cfg: RunConfig, init_dir: Path, ckpt: Path | None = None):
    """The one place a `Trainer` is built (in the driver on the local runtime, in the trainer
    actor on Ray): policy from ``ckpt`` when resuming, else ``init_dir``; reference model from
    ``init_dir`` when the objective needs one; objective from ``cfg.algo``; and, from
    ``ckpt``, optimiser, LR schedule, RNG and policy version."""
    from reroll.algo import build_objective
    from reroll.trainer import checkpoint
    from reroll.trainer.step import Trainer

    model, tok = load_model(ckpt / "model" if ckpt else init_dir, cfg)
    objective = build_objective(cfg.algo)
    ref = load_model(init_dir, cfg)[0].eval() if objective.needs_ref else None
    t = cfg.train
    trainer = Trainer(model, objective, pad_id=tok.pad_token_id, lr=t.lr,
                      weight_decay=t.weight_decay, warmup_steps=t.warmup_steps,
                      grad_clip=t.grad_clip, minibatches=t.minibatches, micro_batch=t.micro_batch,
                      temperature=cfg.rollout.temperature, ref_model=ref, tokenizer=tok)
    if ckpt:
        checkpoint.load_trainer_state(ckpt, trainer.opt, trainer.sched)
        trainer.version = checkpoint.read_state(ckpt).get("version", 0)
    return trainer


def build_trainer_handle(cfg: RunConfig, init_dir: Path, ckpt: Path | None = None):
    """The trainer the loop drives (a `TrainerHandle`): a `Trainer` in this process, or with
    `runtime.kind = "ray"` a proxy to one built by `build_trainer` in a Ray actor."""
    if cfg.runtime.kind == "ray":
        from reroll.runtime.ray import RayTrainer

        return RayTrainer(cfg, init_dir, ckpt)
    return build_trainer(cfg, init_dir, ckpt)


def build_task(cfg: RunConfig):
    from reroll.tasks import TASKS

    return TASKS.get(cfg.task.name)(cfg.task.seed, **cfg.task.args)


def encode_prompt(tok):
    """Prompt text -> token ids, with the tokenizer's BOS when it defines one."""

    def encode(text: str) -> list[int]:
        ids = tok(text, add_special_tokens=False).input_ids
        if tok.bos_token_id is not None:
            ids = [tok.bos_token_id] + ids
        return ids

    return encode


def sampling_params(cfg: RunConfig, tok) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop_token_ids=[tok.eos_token_id])


def build_scorer(cfg: RunConfig, task):
    """A pool of verifier processes in this process; on Ray with `runtime.scoring_workers`,
    the same pools inside Ray actors, behind the same interface."""
    if cfg.runtime.kind == "ray" and cfg.runtime.scoring_workers > 0:
        from reroll.runtime.ray import init_ray
        from reroll.runtime.ray_scoring import RayScoringPool

        init_ray(cfg.runtime.engine_workers)
        return RayScoringPool(cfg.reward.verifiers, task.verifier,
                              actors=cfg.runtime.scoring_workers, workers=cfg.reward.workers,
                              timeout_s=cfg.reward.timeout_s)
    from reroll.verifiers import ScoringPool

    return ScoringPool(cfg.reward.verifiers, task.verifier, workers=cfg.reward.workers,
                       timeout_s=cfg.reward.timeout_s)


def build_engine(model, tok, cfg: RunConfig, version: int = 0, model_path: Path | None = None,
                 weights=None):
    """The engine gets its own copy of the weights: the trainer updates its copy in place,
    and the engine takes new weights only through `update_weights`, with a version. The
    starting weights are ``model``'s, or with ``model=None`` the model at ``model_path``
    loaded with ``weights`` (a state dict; on Ray also an object-store reference, which the
    engine actors read without a copy through this process). With `runtime.kind = "ray"`
    the engine is a pool of Ray actors behind the same interface."""
    n = cfg.rollout.batch_groups * cfg.rollout.group_size
    slots = max(8, int(n * cfg.runtime.overprovision) * (1 + min(cfg.runtime.max_staleness, 1)))
    if cfg.runtime.kind == "ray":
        from reroll.runtime.ray import RayEnginePool

        if model is not None:
            weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        workers = max(1, cfg.runtime.engine_workers)
        return RayEnginePool(model_path, workers=workers, dtype=cfg.model.dtype,
                             max_batch=-(-slots // workers), version=version,
                             threads=cfg.runtime.threads, state_dict=weights)
    from reroll.engine import TorchEngine

    if model is None:
        model = load_model(model_path, cfg)[0]
        model.load_state_dict(weights)
    else:
        model = copy.deepcopy(model)
    return TorchEngine(model.eval(), tok, max_batch=slots, version=version)


def build_filters(cfg: RunConfig) -> list:
    from reroll.control.filters import FILTERS

    if not cfg.algo.dynamic_sampling:
        return []
    zero_var = FILTERS.get("zero_variance")

    def correctness_spread(g):  # DAPO filters on correctness (first component), not shaping
        return zero_var([[r.scores[0].value for r in g.rollouts]])[0]

    return [correctness_spread]


def build_shaping(cfg: RunConfig):
    """DAPO's soft overlong punishment as a reward-shaping term, or None."""
    if cfg.algo.overlong_buffer <= 0:
        return None
    import torch

    from reroll.algo.shaping import overlong_penalty

    L, buf, k = cfg.rollout.max_new_tokens, cfg.algo.overlong_buffer, cfg.algo.overlong_penalty
    return lambda r: float(overlong_penalty(torch.tensor([float(r.response_len)]), max_len=L,
                                            buffer=buf, factor=k)[0])
