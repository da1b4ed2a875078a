"""Pruners: policies that cut rollouts while they are generated (``control.pruner``).

Owns the ``PRUNERS`` registry (its entries are methods', e.g. ARRoL in
`reroll.methods.arrol`, registered when the registry is first looked up) and the building
of the configured one. A pruner is built as ``cls(group_size, max_new_tokens, *,
hyperparameters)`` and answers:

- ``size``: members generated per group (``n'``), which admission reserves and the
  scheduler counts; ``rollout.group_size`` (``n``) stays the number trained;
- ``prepare(rollouts)``: per-sample rules on a new group's members (their `PruneRule`);
- ``settle(group, success)``: a complete group's records (labels, pruned members out of
  the loss);
- ``resume(group)``: a group restored from a checkpoint mid-generation;
- ``metrics(groups)``: counts over a step's consumed groups.

Its entry may declare traits: ``check(cfg, pruner)``, the combinations of keys it cannot
work with (called when the config is checked), and ``trainer(inner, pruner, *, seed,
ckpt)``, a trainer handle that wraps the run's trainer when the pruner learns beside the
policy. Reads the ``[control]`` and ``[rollout]`` sections only; knows nothing of
engines, threads or the event loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reroll.registry import METHODS, Registry

if TYPE_CHECKING:
    from reroll.config import ControlConfig, RolloutConfig

PRUNERS = Registry("pruner", plugins=METHODS)


def build_pruner(control: ControlConfig, rollout: RolloutConfig):
    """The configured pruner, or None (``control.pruner = "none"``)."""
    if control.pruner == "none":
        return None
    return PRUNERS.get(control.pruner)(rollout.group_size, rollout.max_new_tokens,
                                       **control.pruner_args)


def generated_group_size(control: ControlConfig, rollout: RolloutConfig) -> int:
    """Members generated per group: the pruner's ``size``, else ``rollout.group_size``."""
    p = build_pruner(control, rollout)
    return p.size if p is not None else rollout.group_size
