"""ARRoL (online pruning; docs/algorithms.md): prune an over-provisioned group as it is
generated, keeping the members that make the surviving group most informative, as judged by
a small quality head trained online on the policy's hidden states.

A group gets ``n' = ceil(overprovision x n)`` members; at ``at`` response tokens the engine
keeps ``n`` of them, those whose predicted successes give the group the most expected
reward variance (random cuts while the head warms up). Pruned members keep their record
(finish ``"pruned"``), are scored and counted, and leave the loss and their group's
advantages. The head learns beside the policy, in the same training step, from the labels
of the finished members (`reroll.methods.arrol_head`).

Owns the ``arrol`` pruner (`ARRoL`: the groups' size, the rule each member carries, labels
and loss exclusion when a group settles, a restored group's rules, the step's counts), its
config check (`check_arrol`, the ``check`` trait: what pruning cannot work with) and its
``trainer`` trait (`ArrolTrainer`, which wraps the run's trainer). What runs inside
generation (the head, its transport with the weights, the survivors' rule, a group's gate)
is the engine's, `reroll.engine.quality` and `reroll.engine.plugins.prune`: a Ray engine
actor never imports this module. Knows nothing of engines' slots, threads or the event
loop.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from reroll.control.pruners import PRUNERS
from reroll.errors import ConfigError
from reroll.methods.arrol_head import ArrolTrainer
from reroll.rollout import Group, PruneRule, Rollout

if TYPE_CHECKING:
    from reroll.config import RunConfig

PRUNED = "arrol_pruned"  # the loss_exclusion of a pruned sample


class ARRoL:
    """ARRoL (online pruning; docs/algorithms.md): ceil(overprovision x group_size)
    samples per group, cut to group_size inside the engine at `at` response tokens so that
    the survivors balance predicted successes and failures (a quality head on the policy's
    hidden states, trained online); random cuts until the head has seen `warmup` finished
    samples. Pruned samples keep their record (finish "pruned"), are scored and counted,
    and are left out of the loss and of their group's advantages.

    ``at``: the checkpoint, response tokens sampled (0: rollout.max_new_tokens // 4, at
    least 1); ``overprovision``: n' / n; ``lr``: the head's Adam learning rate; ``warmup``:
    finished samples the head trains on before it decides; ``hidden``: units of its hidden
    layer (0: a linear head); ``updates``: head steps per training step on its samples;
    ``confidence``: the prefix's log-prob mean and min as two more features (False: the
    hidden state and the position only)."""

    def __init__(self, group_size: int, max_new_tokens: int, /, *, at: int = 0,
                 overprovision: float = 1.5, lr: float = 1e-2, warmup: int = 256,
                 hidden: int = 0, updates: int = 1, confidence: bool = True):
        if group_size < 1 or overprovision <= 1.0:
            raise ValueError(f"pruner 'arrol': needs group_size >= 1 and overprovision > 1, "
                             f"got {group_size}, {overprovision}")
        self.keep = group_size
        self.size = max(group_size + 1, math.ceil(group_size * overprovision - 1e-9))
        self.at = at or max(1, max_new_tokens // 4)
        if self.at >= max_new_tokens:
            raise ValueError(f"pruner 'arrol': at ({self.at}) must be below rollout."
                             f"max_new_tokens ({max_new_tokens}): no sample would reach it")
        self.lr, self.warmup, self.hidden, self.updates = lr, warmup, hidden, updates
        self.confidence = confidence

    # ---- a new group -------------------------------------------------------------------
    def prepare(self, rollouts: list[Rollout]) -> None:
        rule = PruneRule(at=self.at, keep=self.keep, size=self.size)
        for r in rollouts:
            r.sampling = replace(r.sampling, prune=rule)

    def resume(self, g: Group) -> None:
        """A restored group still undecided: its members that finished before the
        checkpoint are given to the others' rules (a new engine never saw them finish)."""
        recs = [r.control.get("arrol", {}) for r in g.rollouts]
        if any("decision" in d and d["decision"] != "finished" for d in recs):
            return  # decided before the checkpoint: the records say everything
        done = tuple((r.index_in_group, d["p"], d["at"]) for r, d in zip(g.rollouts, recs)
                     if d.get("decision") == "finished")
        for r in g.rollouts:
            if not r.finished and r.sampling.prune is not None:
                r.sampling = replace(r.sampling, prune=replace(r.sampling.prune,
                                                                settled=done))

    # ---- a complete group --------------------------------------------------------------
    def settle(self, g: Group, success: Callable[[Rollout], bool]) -> None:
        """Pruned members leave the loss (weight 0); the others get their label."""
        for r in g.rollouts:
            rec = r.control.setdefault("arrol", {})
            if r.finish == "pruned":
                r.loss_exclusion = r.loss_exclusion or PRUNED
                r.sample_weight = 0.0
            else:
                rec["correct"] = bool(success(r))

    @staticmethod
    def metrics(groups: list[Group]) -> dict[str, float]:
        """Per step, over the consumed groups: pruned and early-finished samples, groups cut
        at random (warm-up), tokens the pruned samples had sampled, an estimate of the
        tokens they would have sampled after the checkpoint (the mean of their group's
        survivors that went on), and the share of groups whose survivors hold both a
        success and a failure."""
        recs = [(g, r, r.control.get("arrol", {})) for g in groups for r in g.rollouts
                if r.sampling.prune is not None]
        if not recs:
            return {}
        pruned = [r for _, r, d in recs if r.finish == "pruned"]
        cut_est, mixed, random_groups = 0.0, 0, 0
        for g in groups:
            kept = [r.response_len - r.sampling.prune.at for r in g.rollouts
                    if r.control.get("arrol", {}).get("decision") == "kept"]
            gone = sum(r.finish == "pruned" for r in g.rollouts)
            cut_est += gone * max(0.0, statistics.fmean(kept)) if kept and gone else 0.0
            labels = {r.control.get("arrol", {}).get("correct") for r in g.rollouts
                      if r.finish != "pruned"}
            mixed += labels >= {True, False}
            random_groups += any(r.control.get("arrol", {}).get("mode") == "random"
                                 for r in g.rollouts)
        return {"control/arrol_pruned": float(len(pruned)),
                "control/arrol_finished_early": float(sum(d.get("decision") == "finished"
                                                          for _, _, d in recs)),
                "control/arrol_random_groups": float(random_groups),
                "control/arrol_pruned_tokens": float(sum(r.response_len for r in pruned)),
                "control/arrol_tokens_saved_est": cut_est,
                "control/arrol_mixed_groups": mixed / len(groups)}


def check_arrol(cfg: RunConfig, p: ARRoL) -> None:
    """The combinations ARRoL cannot work with, refused when the config is checked, naming
    the keys (``p``: the pruner built from the config)."""
    c = cfg.control
    refuse = {
        "engine.name": (cfg.engine.name != "torch", "the quality head runs inside the torch "
                        "engine (servers over HTTP have no hook for it)"),
        "runtime.kind": (cfg.runtime.kind != "local", "the head reaches engines in this "
                         "process only"),
        "rollout.workflow": (cfg.rollout.workflow != "single_turn", "its checkpoint counts "
                             "the tokens of one response"),
        "control.allocator": (c.allocator != "fixed", "a pruned group is generated at its "
                              "full size in one round"),
        "control.duet_abort": (c.duet_abort, "DUET's gate prunes the same samples by another "
                               "rule (and keeps its pruned ones in the baseline)"),
        "algo.dynamic_sampling": (cfg.algo.dynamic_sampling, "the zero-variance filter would "
                                  "judge the pruned, truncated samples too"),
        "control.dot_k / control.dot_quantile": (c.dot_k > 0 or c.dot_quantile > 0, "DOT's "
                                                 "all-correct test would count the pruned"),
        "replay.buffer_size / replay.reuse / replay.draft": (
            cfg.replay.buffer_size > 0 or cfg.replay.reuse or cfg.replay.draft != "none",
            "replayed, reused or drafted samples do not reach the checkpoint as one group"),
    }
    for key, (bad, why) in refuse.items():
        if bad:
            raise ConfigError(f"control.pruner = {c.pruner!r} does not work with the "
                              f"configured {key}: {why}")
    if 0 < cfg.engine.max_batch < p.size:
        raise ConfigError(f"engine.max_batch ({cfg.engine.max_batch}) is below the "
                          f"{p.size} members of a pruned group, which decode together")


PRUNERS.register("arrol", ranges={"at": "[0, inf)", "overprovision": "(1, inf)",
                                  "lr": "(0, inf)", "warmup": "[0, inf)", "hidden": "[0, inf)",
                                  "updates": "[1, inf)"},
                 check=check_arrol, trainer=ArrolTrainer)(ARRoL)
