"""Component builders: turn a RunConfig into components (the process' threads and memory,
model, tokenizer, task, objective, trainer, engine core). Looks things up in registries;
holds no algorithm logic, no loop, and knows no runtime: `reroll.runtime` (the composition
root) decides where each component runs and calls these. The rollout side (codecs,
scorer, workflow context, group starter, filters, shaping) is built by
`reroll.build_rollout`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
from pathlib import Path

from reroll.config import RunConfig
from reroll.devices import resolve_device, resolved_engine_device


def torch_threads(cfg: RunConfig) -> int:
    """Intra-op threads per side: ``runtime.threads``, or with 0 every core this process may
    use in a synchronous run (trainer and engine take turns) and half of them in an async
    one (they work at the same time)."""
    if cfg.runtime.threads > 0:
        return cfg.runtime.threads
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = max(1, cores or 1)
    return cores if cfg.runtime.max_staleness == 0 else max(1, cores // 2)


def engine_threads(cfg: RunConfig) -> int:
    """Intra-op threads of the engine's decode thread: ``runtime.engine_threads``, or with 0
    the trainer's (`torch_threads`)."""
    return cfg.runtime.engine_threads or torch_threads(cfg)


def prepare_process(cfg: RunConfig) -> None:
    """Set this thread's torch threads (threads started afterwards inherit them; the
    engine's decode thread sets its own, `engine_threads`), with
    ``runtime.keep_freed_memory`` glibc's malloc thresholds (`reroll.memory`), and with
    ``runtime.deterministic`` torch's deterministic kernels; imports the run's
    plug-in modules (``plugins``: a Ray actor's process registers them too)."""
    import torch

    from reroll.memory import keep_freed_memory
    from reroll.plugins import import_plugins

    import_plugins(cfg.plugins)
    torch.set_num_threads(torch_threads(cfg))
    # a thread takes the count last set anywhere when it first asks for one: ask now, so
    # that an engine thread setting its own (runtime.engine_threads) leaves this one's alone
    torch.get_num_threads()
    if cfg.runtime.keep_freed_memory:
        keep_freed_memory()
    if cfg.runtime.deterministic:
        deterministic_kernels()


def deterministic_kernels() -> None:
    """`runtime.deterministic` in this process: before its first CUDA work (cuBLAS reads its
    workspace setting when it starts)."""
    import torch

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def quiet_transformers() -> None:
    from transformers.utils import logging as tlog

    tlog.disable_progress_bar()
    tlog.set_verbosity_error()


def weights_dir(path: str | Path) -> Path:
    """The model directory a user means by ``path``: a model directory itself, an sft output
    or checkpoint directory (its ``model/``), or an RL run directory (the model of its
    latest complete checkpoint)."""
    p = Path(path)
    if (p / "config.json").is_file():
        return p
    if (p / "model" / "config.json").is_file():
        return p / "model"
    if (p / "checkpoints").is_dir():
        from reroll.trainer import checkpoint

        ck = checkpoint.latest(p)
        if ck is not None:
            return ck / "model"
    raise FileNotFoundError(f"{p} holds no model: expected a model directory (config.json), "
                            f"an sft or checkpoint directory (model/), or a run directory "
                            f"with checkpoints/")


def model_dir(cfg: RunConfig, run_dir: Path) -> Path:
    """Where the starting weights come from: `init` (see `weights_dir`), else `model.path`,
    else a tiny model built from `model.*` into RUN/init (random init, seeded)."""
    from reroll.models import build_tiny

    if cfg.init:
        return weights_dir(cfg.init)
    if cfg.model.path:
        return Path(cfg.model.path)
    target = run_dir / "init"
    if not (target / "config.json").is_file():  # built aside and renamed: a kill mid-way
        import shutil  # never leaves a half-written model

        quiet_transformers()
        tmp = run_dir / ".init.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)
        build_tiny(cfg.model, tmp, seed=cfg.train.seed)
        tmp.rename(target)
    return target


def load_model(path: Path, cfg: RunConfig, dtype: str | None = None):
    """(model, tokenizer) from ``path``, in ``dtype`` (default `model.dtype`), on
    `model.device` ("auto": cuda when there is one)."""
    from reroll.models import load

    quiet_transformers()
    model, tok = load(path, dtype or cfg.model.dtype)
    return model.to(resolve_device(cfg.model.device)), tok


def load_policy(cfg: RunConfig, init_dir: Path, ckpt: Path | None = None):
    """(model, tokenizer) a run trains, in float32 (the master weights): ``ckpt``'s model
    when resuming, else ``init_dir``'s. With ``[lora]`` (``lora.rank > 0``), ``init_dir``'s
    weights frozen under LoRA adapters (`reroll.lora`), fresh or ``ckpt``'s. Fresh adapters
    are drawn from ``train.seed`` alone, whatever this process drew before (a Ray trainer
    actor starts them as the local runtime does); the caller's random state is left as
    it was."""
    if cfg.lora.rank == 0:
        return load_model(ckpt / "model" if ckpt else init_dir, cfg, dtype="float32")
    import torch

    from reroll import lora

    model, tok = load_model(init_dir, cfg, dtype="float32")
    lc = cfg.lora
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(cfg.train.seed)
        model = lora.wrap(model, rank=lc.rank, alpha=lc.alpha, dropout=lc.dropout,
                          target_modules=lc.target_modules, base_dir=init_dir)
    if ckpt:
        lora.load_adapter(model, ckpt / "model")
    return model, tok


def load_tokenizer(path: Path):
    """The tokenizer of a model directory alone (the driver needs no model to encode)."""
    from transformers import AutoTokenizer

    quiet_transformers()
    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token_id is None:  # as reroll.models.load does
        tok.pad_token = tok.eos_token
    return tok


def cadence(cfg: RunConfig):
    """The RL loop's clock (`reroll.loop.Cadence`) from ``train.steps``, ``log_every``,
    ``ckpt_every``, ``record_every``, ``eval.every`` and ``eval.at_start``."""
    from reroll.loop import Cadence

    return Cadence(steps=cfg.train.steps, log_every=cfg.log_every, ckpt_every=cfg.ckpt_every,
                   record_every=cfg.record_every, eval_every=cfg.eval.every,
                   eval_at_start=cfg.eval.at_start)


def build_trainer(cfg: RunConfig, init_dir: Path, ckpt: Path | None = None):
    """The one place a `Trainer` is built (in the driver on the local runtime, in the trainer
    actor on Ray): policy from ``ckpt`` when resuming, else ``init_dir``; reference model from
    ``init_dir`` when the objective needs one; objective from ``cfg.algo``; and, from
    ``ckpt``, optimiser, LR schedule, RNG and policy version.

    The policy is always held in float32 (the master weights, so AdamW's state is float32
    too); ``model.dtype = bfloat16`` runs its forward and backward under bf16 autocast and
    publishes bf16 weights to the engine; ``float16`` only publishes float16 (fp16 autocast
    would need loss scaling). The reference model, never trained, is held in `model.dtype`.
    A pruner whose entry has a ``trainer`` trait wraps the Trainer in it (ARRoL's
    `ArrolTrainer`: its quality head trains in the same step, restored from ``ckpt`` too)."""
    import torch

    from reroll.algo import build_objective
    from reroll.config import ConfigError
    from reroll.trainer.options import TrainerOptions
    from reroll.trainer.precision import autocast_dtype
    from reroll.trainer.step import Trainer

    model, tok = load_policy(cfg, init_dir, ckpt)
    if cfg.train.gradient_checkpointing:
        # the trainer flags checkpointed layers training in an eval-mode model (see
        # `checkpointed_layers_training`): a layer that applies dropout itself would then
        # apply it, so a model configured with dropout is refused
        drop = {k: v for k, v in model.config.get_text_config().to_dict().items()
                if ("dropout" in k or "pdrop" in k) and isinstance(v, float) and v > 0}
        if drop:
            raise ConfigError(f"train.gradient_checkpointing needs a model without dropout "
                              f"(RL trains in eval mode); its config has {drop}: set them to 0")
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False  # no KV cache in training forwards
    objective = build_objective(cfg.algo)
    ref = load_model(init_dir, cfg)[0].eval() if objective.needs_ref else None
    text = model.config.get_text_config()
    # mixture of experts: an expert reached only by skipped samples would get no gradient
    # (None, so no AdamW step) instead of a zero one, so such models pass every sample
    experts = max((v for k in ("num_experts", "num_local_experts", "n_routed_experts",
                               "moe_num_experts") if isinstance(v := getattr(text, k, None), int)),
                  default=0)
    t = cfg.train
    options = TrainerOptions(
        pad_id=tok.pad_token_id, lr=t.lr, weight_decay=t.weight_decay,
        warmup_steps=t.warmup_steps, schedule=t.schedule,
        total_steps=t.schedule_steps or t.steps, grad_clip=t.grad_clip,
        minibatches=t.minibatches, micro_batch=t.micro_batch,
        micro_batch_tokens=t.micro_batch_tokens, temperature=cfg.rollout.temperature,
        skip_inert=t.skip_zero_advantage and experts <= 1, logprob_chunk=t.logprob_chunk,
        share_prompt=t.share_prompt, autocast_dtype=autocast_dtype(cfg.model.dtype),
        publish_dtype=getattr(torch, cfg.model.dtype), fused_optimizer=t.fused_optimizer,
        prox_ema=t.prox_ema, old_snapshots=t.old_snapshots,
        snapshot_lag=cfg.runtime.max_staleness + (cfg.runtime.overprovision > 1))
    trainer = Trainer(model, objective, options, tokenizer=tok, ref_model=ref)
    if ckpt:
        trainer.resume(ckpt)
    from reroll.control.pruners import PRUNERS, build_pruner

    pruner = build_pruner(cfg.control, cfg.rollout)
    wrap = PRUNERS.trait(cfg.control.pruner, "trainer") if pruner is not None else None
    if wrap is not None:  # a pruner that learns in the same step (ARRoL's quality head)
        return wrap(trainer, pruner, seed=cfg.train.seed, ckpt=ckpt)
    return trainer


def build_task(cfg: RunConfig, tok=None, model_path: Path | None = None):
    """The task (its train split cut to ``task.train_limit``); given the tokenizer and
    model, prompts that leave the model no room to answer are refused (or skipped and
    counted with ``task.skip_long_prompts``) now, and one warning counts those that leave
    fewer than ``rollout.max_new_tokens`` positions."""
    import warnings

    from reroll.build_rollout import encode_prompt
    from reroll.tasks import TASKS
    from reroll.tasks.base import check_prompt_lengths

    task = TASKS.get(cfg.task.name)(cfg.task.seed, **cfg.task.args)
    if cfg.task.train_limit:
        from reroll.errors import ConfigError

        if cfg.task.train_limit > len(task.train):
            raise ConfigError(f"task.train_limit = {cfg.task.train_limit}, but task "
                              f"{cfg.task.name!r} has {len(task.train)} train examples")
        task = dataclasses.replace(task, train=task.train[:cfg.task.train_limit])
    if tok is not None and model_path is not None:
        where = f"task {cfg.task.name!r}" + (f" ({cfg.task.args['path']})"
                                             if "path" in cfg.task.args else "")
        limit, room = context_length(model_path), cfg.rollout.max_new_tokens
        fit = check_prompt_lengths(task, encode_prompt(tok, cfg.task.chat), limit,
                                   where=where, skip=cfg.task.skip_long_prompts, room=room)
        if fit.dropped:
            warnings.warn(f"{where}: skipped {fit.dropped} example(s) whose prompt leaves no "
                          f"room to answer (task.skip_long_prompts)", UserWarning, stacklevel=2)
        if fit.first_cut is not None:
            pid, split, n = fit.first_cut
            warnings.warn(f"{where}: {fit.cut} prompt(s) leave fewer than "
                          f"rollout.max_new_tokens = {room} positions of the model's "
                          f"{limit}-token context, so their answers will be cut (the first: "
                          f"{pid!r}, {split}, {n} tokens); shorten them, raise the context "
                          f"({(context_of(cfg) or (0, 'its config.json'))[1]}) or lower rollout.max_new_tokens",
                          UserWarning, stacklevel=2)
    return task


def context_of(cfg: RunConfig, model_dir: Path | None = None) -> tuple[int, str] | None:
    """The context (tokens) of the model a command loads and what sets it: ``model_dir``'s
    config.json when given (an evaluated checkpoint), else that of the model `init` or
    `model.path` names (`model.*` does not apply to a model loaded from disk), else
    `model.max_position` (the tiny model `[model]` builds). None when the model cannot be
    found yet."""
    if model_dir is None and not cfg.init and not cfg.model.path:
        return cfg.model.max_position, "model.max_position"
    if model_dir is None:
        try:
            model_dir = weights_dir(cfg.init or cfg.model.path)
        except (FileNotFoundError, OSError):
            return None
    where = Path(model_dir) / "config.json"
    if not where.is_file():
        return None
    return context_length(Path(model_dir)), f"max_position_embeddings in {where}"


def context_length(model_path: Path) -> int:
    """Tokens a model directory's config allows (as the engine caps it)."""
    cfg = json.loads((Path(model_path) / "config.json").read_text())
    limit = cfg.get("max_position_embeddings") or cfg.get("n_positions") or 2048
    return min(int(limit), 2048)


def engine_slots(cfg: RunConfig) -> int:
    """KV-cache slots: `engine.max_batch`, or enough for the samples in flight (a pruner's
    groups in full)."""
    from reroll.control.pruners import generated_group_size

    if cfg.engine.max_batch:
        return cfg.engine.max_batch
    n = cfg.rollout.batch_groups * generated_group_size(cfg.control, cfg.rollout)
    return max(8, int(n * cfg.runtime.overprovision) * (1 + min(cfg.runtime.max_staleness, 1)))


def build_engine(model, tok, cfg: RunConfig, version: int = 0, max_batch: int | None = None,
                 device: str | None = None):
    """A step-wise engine core from the `ENGINES` registry, on its own copy of ``model``'s
    weights: the trainer updates its copy in place, and the engine takes new weights only
    through `update_weights`, with a version. The copy is in `model.dtype` (the trainer's
    master weights are float32), on ``device`` (`engine.device` for a training run's engine),
    else on ``model``'s own."""
    import torch

    from reroll.engine import ENGINES

    # a run that generates on servers (trait ``remote``) still evaluates in this process
    name = "torch" if ENGINES.trait(cfg.engine.name, "remote", False) else cfg.engine.name
    from reroll.lora import is_lora, plain_copy

    copy_to = (device or next(model.parameters()).device, getattr(torch, cfg.model.dtype))
    # a LoRA policy: a plain copy holding the merged weights (no adapter layers: the engine
    # merges published adapters into its plain weights, `reroll.engine.lora_apply`)
    engine_model = (plain_copy(model, *copy_to, module_copy) if is_lora(model)
                    else module_copy(model, *copy_to))
    return ENGINES.get(name)(engine_model, tok, max_batch=max_batch or engine_slots(cfg),
                             version=version)


def module_copy(model, device, dtype):
    """A deep copy of ``model`` whose parameters and buffers are on ``device``, the floating
    ones in ``dtype`` (as ``Module.to`` converts them), made tensor by tensor: neither device
    ever holds a second full-precision copy (a deepcopy then ``.to`` would, on the model's
    own device), gradients are not copied, and tied parameters stay tied. Ties are kept where
    modules share one Parameter object (how transformers ties embeddings); two distinct
    Parameters over one storage come out untied. Tensor attributes that are neither
    parameters nor buffers are deep-copied as they are (device unchanged)."""
    import itertools

    import torch

    memo: dict[int, torch.Tensor] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        if id(t) not in memo:
            new = t.detach().to(device=device, dtype=dtype if t.is_floating_point() else None,
                                copy=True)
            memo[id(t)] = (torch.nn.Parameter(new, requires_grad=t.requires_grad)
                           if isinstance(t, torch.nn.Parameter) else new)
    return copy.deepcopy(model, memo)


def run_engine(trainer, tok, cfg: RunConfig):
    """The engine a training run generates with: `build_engine` over the trainer's policy,
    or a remote engine (``engine.name = "openai"``), built from the ``[engine]`` fields named
    like its keyword-only parameters, connected, and given the trainer's weights; a server
    that cannot take new weights stops the run here, saying why."""
    from reroll.engine import ENGINES

    if not ENGINES.trait(cfg.engine.name, "remote", False):
        core = build_engine(trainer.policy(), tok, cfg, version=trainer.version,
                            device=resolved_engine_device(cfg))
        head = getattr(trainer, "head_weights", None)  # ARRoL's quality head, same version
        if head is not None:
            core.load_head(head())
        return core
    keys = set(ENGINES.hyperparameters(cfg.engine.name)) - {"version"}
    kwargs = {k: getattr(cfg.engine, k) for k in keys if hasattr(cfg.engine, k)}
    engine = ENGINES.get(cfg.engine.name)(trainer.policy(), tok, version=trainer.version,
                                          **kwargs)
    engine.connect(trainer.weights(), need_updates=True)
    return engine
