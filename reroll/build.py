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
        quiet_transformers()
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


def build_engine(model, tok, cfg: RunConfig, version: int = 0, model_path: Path | None = None):
    """The engine gets its own copy of the weights: the trainer updates its copy in place,
    and the engine takes new weights only through `update_weights`, with a version. With
    `runtime.kind = "ray"` the engine is a pool of Ray actors behind the same interface."""
    n = cfg.rollout.batch_groups * cfg.rollout.group_size
    slots = max(8, int(n * cfg.runtime.overprovision) * (1 + min(cfg.runtime.max_staleness, 1)))
    if cfg.runtime.kind == "ray":
        from reroll.runtime.ray import RayEnginePool

        workers = max(1, cfg.runtime.engine_workers)
        return RayEnginePool(model_path, workers=workers, dtype=cfg.model.dtype,
                             max_batch=-(-slots // workers), version=version,
                             threads=cfg.runtime.threads,
                             state_dict={k: v.detach().clone() for k, v in
                                         model.state_dict().items()})
    from reroll.engine import TorchEngine

    return TorchEngine(copy.deepcopy(model).eval(), tok, max_batch=slots, version=version)


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
