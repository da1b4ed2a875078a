"""Checks of a loaded config that need more than its types: registry choices and their
hyperparameters (against each component's signature, so a typo fails before any work
starts), ranges, and combinations that would silently do nothing. Imports the registries,
so `reroll.config` itself stays free of torch; `load_config` calls `validate`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from reroll.errors import ConfigError

if TYPE_CHECKING:
    from reroll.config import RunConfig


def validate(cfg: RunConfig) -> None:
    """Check registry-backed choices and their hyperparameters (imports the registries)."""
    from reroll.registry import RegistryError

    try:
        from reroll import algo, tasks, verifiers

        a = cfg.algo
        algo.ADVANTAGES.check_kwargs(a.advantage, a.advantage_args, "algo.advantage_args")
        algo.SURROGATES.check_kwargs(a.surrogate, a.surrogate_args, "algo.surrogate_args")
        algo.AGGREGATIONS.check_kwargs(a.aggregation, a.aggregation_args, "algo.aggregation_args")
        algo.KL_ESTIMATORS.get(a.kl)
        algo.CORRECTIONS.check_kwargs(a.correction, a.correction_args, "algo.correction_args")
        tasks.TASKS.check_kwargs(cfg.task.name, cfg.task.args, "task.args")
        for i, v in enumerate(cfg.reward.verifiers):
            where = f"reward.verifiers[{i}]"
            extra = set(v) - {"name", "weight", "args"}
            if "name" not in v or extra:
                raise ConfigError(f"{where}: expects keys name, weight, args; got {sorted(v)}")
            verifiers.VERIFIERS.check_kwargs(v["name"], v.get("args", {}), where)
        if not getattr(algo.ADVANTAGES.get(a.advantage), "uses_scalar_reward", True):
            shaping = [k for k, on in (("algo.kl_in_reward", a.kl_in_reward and a.kl_coef > 0),
                                       ("algo.overlong_buffer", a.overlong_buffer > 0)) if on]
            if shaping:
                raise ConfigError(
                    f"algo.advantage {a.advantage!r} normalises the reward components, not the "
                    f"scalar reward, so {' and '.join(shaping)} would have no effect; turn "
                    f"them off or pick another advantage")
    except RegistryError as e:
        raise ConfigError(str(e)) from None
    positive = {"rollout.group_size": cfg.rollout.group_size,
                "rollout.batch_groups": cfg.rollout.batch_groups,
                "rollout.max_new_tokens": cfg.rollout.max_new_tokens,
                "train.minibatches": cfg.train.minibatches, "train.micro_batch": cfg.train.micro_batch,
                "log_every": cfg.log_every, "ckpt_every": cfg.ckpt_every,
                "runtime.threads": cfg.runtime.threads, "reward.timeout_s": cfg.reward.timeout_s}
    for key, v in positive.items():
        if v <= 0:
            raise ConfigError(f"{key} must be > 0, got {v}")
    if not 0 <= cfg.algo.overlong_buffer <= cfg.rollout.max_new_tokens:
        raise ConfigError(f"algo.overlong_buffer must be in [0, rollout.max_new_tokens = "
                          f"{cfg.rollout.max_new_tokens}], got {cfg.algo.overlong_buffer}")
    if cfg.runtime.kind not in ("local", "ray"):
        raise ConfigError(f"runtime.kind must be local or ray, got {cfg.runtime.kind!r}")
    if cfg.sft.schedule not in ("constant", "linear"):
        raise ConfigError(f"sft.schedule must be constant or linear, got {cfg.sft.schedule!r}")
    if cfg.runtime.max_staleness < 0:
        raise ConfigError("runtime.max_staleness must be >= 0")
    if cfg.runtime.scoring_workers < 0:
        raise ConfigError(f"runtime.scoring_workers must be >= 0, got {cfg.runtime.scoring_workers}")
    if cfg.runtime.scoring_workers and cfg.runtime.kind != "ray":
        raise ConfigError("runtime.scoring_workers places scoring actors on Ray: it needs "
                          f"runtime.kind = \"ray\" (got {cfg.runtime.kind!r}); the local "
                          "runtime's scoring processes are reward.workers")
    if cfg.runtime.overprovision < 1.0:
        raise ConfigError("runtime.overprovision must be >= 1.0")
