"""Checks of a loaded config that need more than its types: registry choices and their
hyperparameters (against each component's signature and declared ranges, so a typo or an
out-of-range value fails before any work starts), ranges of every numeric field and the
allowed values of every choice-valued one (declared in the fields, `reroll.config.ranges`),
combinations that would silently do nothing or break a promise (a "synchronous" run with
stale tokens), and warnings for values that are legal but almost surely wrong. Imports the
registries (inside the checks), so `reroll.config` itself stays free of them and of torch.
Where a run is assembled (the CLI commands, `reroll.runtime.train`, `reroll replay`) calls
`validate`, or `load_checked` to load and check at once. Knows nothing of how a run runs."""

from __future__ import annotations

import warnings
from pathlib import Path

from reroll.config import RunConfig, check_ranges, load_config
from reroll.devices import cuda_visible, engine_device, is_cuda_name, resolve_device
from reroll.errors import ConfigError


def _check_device(name: str, key: str = "model.device") -> None:
    if name in ("auto", "cpu"):
        return
    if not is_cuda_name(name):
        raise ConfigError(f"{key} must be auto, cpu, cuda or cuda:N, got {name!r}")
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"{key} = {name!r} but torch sees no CUDA device "
                          f"(torch.cuda.is_available() is False); use {key}=cpu or auto")
    if not cuda_visible(name):
        raise ConfigError(f"{key} = {name!r} but torch sees "
                          f"{torch.cuda.device_count()} CUDA device(s)")


def _check_devices(cfg: RunConfig) -> None:
    """model.device (the trainer's) and engine.device (the engine's; empty: model.device),
    each checked here, in the driver, unless that side reserves GPUs on Ray
    (runtime.trainer_gpus, runtime.engine_gpus): its actors then resolve it among their own
    GPUs (the driver may have none), so it must be auto or cuda."""
    rt = cfg.runtime
    for key in ("engine_gpus", "trainer_gpus"):
        n = getattr(rt, key)
        if n > 0 and rt.kind != "ray":
            raise ConfigError(f"runtime.{key} reserves GPUs for Ray actors: it needs "
                              f"runtime.kind = \"ray\" (got {rt.kind!r}); the local runtime "
                              f"puts its models on model.device and engine.device")
        if n > 1 and n != int(n):
            raise ConfigError(f"runtime.{key} = {n:g}: more than one GPU must be a whole "
                              f"number (a fraction shares one GPU, as Ray places it)")
    engine_key = "engine.device" if cfg.engine.device else "model.device"
    for key, name, gpus in (("model.device", cfg.model.device, "trainer_gpus"),
                            (engine_key, engine_device(cfg), "engine_gpus")):
        if getattr(rt, gpus) > 0:
            if name not in ("auto", "cuda"):
                raise ConfigError(
                    f"runtime.{gpus} > 0 gives each such Ray actor its own GPUs, and its model "
                    f"goes on the first of them: {key} must be auto or cuda, got {name!r}")
        else:
            _check_device(name, key)


def load_checked(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    """`reroll.config.load_config`, then `validate`: a config a run may start from."""
    cfg = load_config(path, overrides)
    validate(cfg)
    return cfg


def validate(cfg: RunConfig, model_dir: Path | None = None) -> None:
    """Import the run's plug-in modules (``plugins``, `reroll.plugins`), then check each
    field's declared range or choices (`reroll.config.ranges`), registry-backed choices and
    combinations; warn on likely mistakes (``model_dir``: the model the command will load,
    when it is not the config's own, e.g. an evaluated checkpoint). Raises `ConfigError` for
    the first problem."""
    from reroll.plugins import import_plugins
    from reroll.registry import RegistryError

    import_plugins(cfg.plugins)  # the user's components register before they are checked
    check_ranges(cfg)
    try:
        _registries(cfg)
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    _combinations(cfg)
    _counts(cfg)
    _tiny_model(cfg)
    _model_files(cfg)
    _lora(cfg)
    _schedule_end(cfg)
    _warnings(cfg)
    _generation_warnings(cfg, model_dir)


def _registries(cfg: RunConfig) -> None:
    from reroll import algo, envs, tasks, verifiers
    from reroll.engine.base import ENGINES
    from reroll.workflows import WORKFLOWS

    a = cfg.algo
    algo.ADVANTAGES.check_kwargs(a.advantage, a.advantage_args, "algo.advantage_args")
    check = algo.ADVANTAGES.trait(a.advantage, "check")  # non-numeric hyperparameters
    if check is not None:
        try:
            check(**a.advantage_args)
        except ValueError as e:
            raise ConfigError(f"algo.advantage_args: {e}") from None
    algo.SURROGATES.check_kwargs(a.surrogate, a.surrogate_args, "algo.surrogate_args")
    algo.AGGREGATIONS.check_kwargs(a.aggregation, a.aggregation_args, "algo.aggregation_args")
    algo.KL_ESTIMATORS.get(a.kl)
    algo.CORRECTIONS.check_kwargs(a.correction, a.correction_args, "algo.correction_args")
    from reroll.methods.vcpo import LR_RULES

    if a.ess_rule not in LR_RULES:
        raise ConfigError(f"algo.ess_rule must be one of "
                          f"{', '.join(LR_RULES.names())}, got {a.ess_rule!r}")
    from reroll.trainer.schedules import SCHEDULES

    for key, value in (("sft.schedule", cfg.sft.schedule), ("train.schedule", cfg.train.schedule)):
        if value not in SCHEDULES:
            raise ConfigError(f"{key} must be one of {', '.join(SCHEDULES.names())}, "
                              f"got {value!r}")
    tasks.TASKS.check_kwargs(cfg.task.name, cfg.task.args, "task.args")
    _engine_registered(ENGINES, cfg.engine.name)
    check_remote_engine(cfg)
    workflow = WORKFLOWS.get(cfg.rollout.workflow)
    if cfg.rollout.env:
        envs.ENVIRONMENTS.check_kwargs(cfg.rollout.env, cfg.rollout.env_args, "rollout.env_args")
    if not getattr(workflow, "uses_verifiers", True) and not cfg.rollout.env:
        raise ConfigError(f"rollout.workflow {cfg.rollout.workflow!r} needs an environment: "
                          f"set rollout.env (one of {', '.join(envs.ENVIRONMENTS.names())})")
    if cfg.rollout.env and getattr(workflow, "uses_verifiers", True):
        raise ConfigError(f"rollout.env = {cfg.rollout.env!r} is used only by an environment "
                          f"workflow; set rollout.workflow = \"multi_turn\" (it is "
                          f"{cfg.rollout.workflow!r})")
    for i, v in enumerate(cfg.reward.verifiers):
        where = f"reward.verifiers[{i}]"
        extra = set(v) - {"name", "weight", "args"}
        if "name" not in v or extra:
            raise ConfigError(f"{where}: expects keys name, weight, args; got {sorted(v)}")
        verifiers.VERIFIERS.check_kwargs(v["name"], v.get("args", {}), where)
    if cfg.reward.verifiers:  # build them now: an import path that does not resolve fails here
        from reroll.verifiers.combine import build_reward

        try:
            build_reward(cfg.reward.verifiers, {})
        except (ValueError, TypeError) as e:
            raise ConfigError(str(e)) from None
    from reroll.control.wiring import check_control

    check_control(cfg)
    from reroll.replay.drafts import check_drafts

    check_drafts(cfg.replay, cfg.engine, cfg.rollout)
    from reroll.workflows.tree import check_tree

    check_tree(cfg)
    if not getattr(algo.ADVANTAGES.get(a.advantage), "uses_scalar_reward", True):
        shaping = [k for k, on in (("algo.kl_in_reward", a.kl_in_reward and a.kl_coef > 0),
                                   ("algo.overlong_buffer", a.overlong_buffer > 0)) if on]
        if shaping:
            raise ConfigError(
                f"algo.advantage {a.advantage!r} normalises the reward components, not the "
                f"scalar reward, so {' and '.join(shaping)} would have no effect; turn "
                f"them off or pick another advantage")


def _engine_registered(engines, name: str) -> None:
    import reroll.engine  # noqa: F401  (registers the built-in engines)

    engines.get(name)


def check_remote_engine(cfg: RunConfig) -> None:
    """``engine.base_url`` and ``engine.server`` go with a remote engine (``openai``): its
    URLs are http(s) ones, the server kind is registered, and it runs in this process."""
    from reroll.engine import ENGINES, SERVERS

    e = cfg.engine
    urls = [e.base_url] if isinstance(e.base_url, str) else e.base_url
    if ENGINES.trait(e.name, "remote", False) and e.device:
        raise ConfigError(f"engine.device places the torch engine's model; engine.name = "
                          f"{e.name!r} generates on servers that place their own")
    if not ENGINES.trait(e.name, "remote", False):
        if e.base_url:
            raise ConfigError(f"engine.base_url is used only by a remote engine (engine.name = "
                              f"\"openai\"); engine.name is {e.name!r}")
        return
    if not isinstance(urls, list) or not urls or not all(
            isinstance(u, str) and u.startswith(("http://", "https://")) for u in urls):
        raise ConfigError(f"engine.name = {e.name!r} needs engine.base_url: an http(s) URL or a "
                          f"list of them, e.g. \"http://127.0.0.1:8000\"; got {e.base_url!r}")
    if len(set(urls)) != len(urls):
        raise ConfigError(f"engine.base_url names a server twice: {urls}")
    SERVERS.get(e.server)
    if cfg.runtime.kind != "local":
        raise ConfigError(f"engine.name = {e.name!r} generates on servers: it runs with "
                          f"runtime.kind = \"local\" (got {cfg.runtime.kind!r})")


def _combinations(cfg: RunConfig) -> None:
    rt = cfg.runtime
    limit = cfg.rollout.policy_token_limit
    if cfg.algo.overlong_buffer > limit:
        raise ConfigError(f"algo.overlong_buffer must be in [0, {limit}] (the policy tokens a "
                          f"sample may hold), got {cfg.algo.overlong_buffer}")
    if rt.scoring_workers and rt.kind != "ray":
        raise ConfigError("runtime.scoring_workers places scoring actors on Ray: it needs "
                          f"runtime.kind = \"ray\" (got {rt.kind!r}); the local "
                          "runtime's scoring processes are reward.workers")
    if rt.pin_cores and rt.kind != "ray":
        raise ConfigError("runtime.pin_cores pins Ray's engine and trainer actors to cores of "
                          f"their own: it needs runtime.kind = \"ray\" (got {rt.kind!r}); the "
                          "local runtime's two sides are threads of one process")
    if rt.max_staleness == 0 and rt.overprovision > 1.0:
        raise ConfigError(
            f"runtime.overprovision = {rt.overprovision} with runtime.max_staleness = 0 would "
            f"train over-provisioned groups one version late, so the run would not be "
            f"synchronous; keep overprovision = 1 for synchronous RL, or set "
            f"runtime.max_staleness >= 1 (over-provisioned groups then lag at most one more)")
    if cfg.log.wandb:
        import importlib.util

        if importlib.util.find_spec("wandb") is None:
            raise ConfigError("log.wandb = true needs the wandb package: "
                              "pip install 'reroll[wandb]'")
    _check_devices(cfg)
    rp = cfg.replay
    if (rp.buffer_size > 0 or rp.reuse) and cfg.algo.correction == "none":
        raise ConfigError(
            "replay.buffer_size / replay.reuse train on samples from older policies, which "
            "algo.correction = \"none\" would treat as on-policy; use tis_token (the "
            "default) or another correction of pi_prox / mu")
    if cfg.model.dtype == "float16" and resolve_device(cfg.model.device) == "cpu":
        raise ConfigError("model.dtype = float16 on CPU runs the engine in float16, which "
                          "CPU kernels do slowly or not at all; use bfloat16 or float32")


def _warnings(cfg: RunConfig) -> None:
    from reroll import algo

    def warn(msg: str) -> None:
        warnings.warn(msg, UserWarning, stacklevel=4)

    if cfg.train.steps <= 0:
        warn(f"train.steps = {cfg.train.steps}: `reroll train` will not train at all")
    if cfg.eval.every > 0 and cfg.eval.n_examples == 0:
        warn("eval.every > 0 with eval.n_examples = 0: evaluation runs on no example")
    if (cfg.runtime.kind == "ray" and cfg.runtime.trainer_gpus > 0 and cfg.eval.every > 0
            and cfg.eval.n_examples > 0):
        warn(f"eval.every = {cfg.eval.every} with runtime.trainer_gpus > 0: in-loop evaluation "
             f"runs in the driver, on its CPU (the GPUs are the actors'), slow for a real "
             f"model; set eval.every = 0 and evaluate checkpoints with `reroll eval`")
    rt = cfg.runtime
    if rt.kind == "ray" and (rt.engine_gpus > 0) != (rt.trainer_gpus > 0):
        # the side that reserves nothing takes its device as the driver resolves it
        if rt.engine_gpus > 0:
            reserving, bare, key, name = "engine", "trainer", "model.device", cfg.model.device
        else:
            key = "engine.device" if cfg.engine.device else "model.device"
            reserving, bare, name = "trainer", "engine", engine_device(cfg)
        if name == "auto" and resolve_device(name) == "cpu":  # an explicit cpu is a choice
            warn(f"runtime.{reserving}_gpus > 0 but the {bare} actor(s) reserve no GPU: they "
                 f"take {key} = {name!r} as this driver resolves it, the CPU; reserve GPUs "
                 f"for them too (runtime.{bare}_gpus) to put them on a GPU")
    if cfg.algo.correction == "none" and rt.max_staleness > 0:  # replay with none is refused
        warn(f"algo.correction = \"none\" with runtime.max_staleness = {rt.max_staleness}: "
             f"samples of older policies train with no behaviour weight (the synchronous "
             f"presets' paper setting); name a correction for them, e.g. "
             f"algo.correction=tis_token")
    adv = algo.ADVANTAGES.get(cfg.algo.advantage)
    if cfg.rollout.group_size == 1 and getattr(adv, "group_normalised", False):
        warn(f"rollout.group_size = 1 with algo.advantage = {cfg.algo.advantage!r}, which "
             f"normalises within groups: every advantage is 0 or un-baselined; use a "
             f"group size >= 2 or a batch-level estimator (reinforce_pp)")


def _counts(cfg: RunConfig) -> None:
    if cfg.train.steps < 0:
        raise ConfigError(f"train.steps must be in [0, inf), got {cfg.train.steps}")


def _tiny_model(cfg: RunConfig) -> None:
    """The tiny model's shape (built from `model.*` when neither `init` nor `model.path`
    names one): attention splits the width into heads, and query heads into groups."""
    m = cfg.model
    if cfg.init or m.path:
        return
    if m.num_heads % m.num_kv_heads:
        raise ConfigError(f"model.num_kv_heads = {m.num_kv_heads} must divide model.num_heads "
                          f"= {m.num_heads} (each key/value head serves a whole group of "
                          f"query heads)")
    if m.hidden_size % m.num_heads:
        raise ConfigError(f"model.num_heads = {m.num_heads} must divide model.hidden_size = "
                          f"{m.hidden_size} (each head takes an equal slice of the width)")


def _lora(cfg: RunConfig) -> None:
    """``[lora]`` needs peft, and adapters to put somewhere."""
    if cfg.lora.rank == 0:
        return
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ConfigError("lora.rank > 0 trains LoRA adapters through the peft package: "
                          "pip install 'reroll[lora]'")
    if not cfg.lora.target_modules or not all(isinstance(m, str) and m
                                              for m in cfg.lora.target_modules):
        raise ConfigError(f"lora.target_modules names the modules that get an adapter (e.g. "
                          f"[\"q_proj\", \"v_proj\"], or [\"all-linear\"]), got "
                          f"{cfg.lora.target_modules!r}")


def _model_files(cfg: RunConfig) -> None:
    """`model.path` names a model directory with its tokenizer (before any work starts)."""
    if cfg.model.path and not cfg.init:
        from reroll.models.tiny import check_model_dir

        check_model_dir(Path(cfg.model.path).expanduser())


def _schedule_end(cfg: RunConfig) -> None:
    """A linear lr decay ends at `train.schedule_steps`; steps after it would train at a
    learning rate of 0, so that is refused with the keys to change."""
    t = cfg.train
    if t.schedule == "linear" and 0 < t.schedule_steps < t.steps:
        raise ConfigError(
            f"train.schedule = \"linear\" decays the learning rate to 0 at update "
            f"train.schedule_steps = {t.schedule_steps}, before train.steps = {t.steps}: the "
            f"updates after it would train at a learning rate of 0. Set train.steps <= "
            f"{t.schedule_steps}, or continue the run's weights in a new run (init=RUN_DIR) "
            f"with a schedule of its own")


def _generation_warnings(cfg: RunConfig, model_dir: Path | None = None) -> None:
    def warn(msg: str) -> None:
        warnings.warn(msg, UserWarning, stacklevel=4)

    r = cfg.rollout
    if r.temperature == 0 and r.group_size > 1 and cfg.train.steps > 0:
        warn(f"rollout.temperature = 0 samples greedily: the {r.group_size} samples of a "
             f"group are identical, so their advantages are 0 and nothing is learned; use a "
             f"temperature > 0 (1.0 keeps the policy's distribution)")
    from reroll.build import context_of

    ctx = context_of(cfg, model_dir)
    if ctx is not None and r.max_new_tokens >= ctx[0]:
        warn(f"rollout.max_new_tokens = {r.max_new_tokens} is not below the model's context "
             f"({ctx[0]} tokens, {ctx[1]}): with the prompt, every answer is cut at "
             f"{ctx[0]} tokens; raise the context or lower rollout.max_new_tokens")
