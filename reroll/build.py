"""Wiring: turn a RunConfig into components (model, tokenizer, task, reward, engine, objective,
trainer, scheduler). Looks things up in registries; holds no algorithm logic and no loop.
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
        build_tiny(cfg.model, target, seed=cfg.train.seed)
    return target


def load_model(path: Path, cfg: RunConfig):
    from reroll.models import load

    quiet_transformers()
    model, tok = load(path, cfg.model.dtype)
    return model, tok


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
    from reroll.verifiers import ScoringPool

    return ScoringPool(cfg.reward.verifiers, task.verifier, workers=cfg.reward.workers,
                       timeout_s=cfg.reward.timeout_s)


def build_engine(model, tok, cfg: RunConfig, version: int = 0):
    """The engine gets its own copy of the weights: the trainer updates its copy in place,
    and the engine takes new weights only through `update_weights`, with a version."""
    from reroll.engine import TorchEngine

    n = cfg.rollout.batch_groups * cfg.rollout.group_size
    slots = int(n * max(cfg.runtime.overprovision, 1.0)) * (1 + min(cfg.runtime.max_staleness, 1))
    return TorchEngine(copy.deepcopy(model).eval(), tok, max_batch=max(8, slots), version=version)


def build_filters(cfg: RunConfig) -> list:
    from reroll.control.filters import FILTERS

    return [FILTERS.get("zero_variance")] if cfg.algo.dynamic_sampling else []


def build_shaping(cfg: RunConfig):
    """DAPO's soft overlong punishment as a reward-shaping term, or None."""
    if cfg.algo.overlong_buffer <= 0:
        return None
    from reroll.algo.shaping import overlong_penalty

    L, buf, k = cfg.rollout.max_new_tokens, cfg.algo.overlong_buffer, cfg.algo.overlong_penalty
    return lambda r: float(overlong_penalty([r.response_len], max_len=L, buffer=buf, factor=k)[0])
