"""One mini-batch's optimiser step, with hooks that set its learning-rate factor.

`OptimiserStep` owns what happens between a mini-batch's last backward pass and the next
one's first: gradients cleared (`begin`), clipped and checked finite, the learning rate
scaled for this step alone by the hooks' factors, AdamW's step. A `StepHook` sees every
pass's loss inputs (`observe`) and names its factor at the step (`lr_factor`). Hooks are
plug-ins: a method registers a factory ``(objective) -> StepHook | None`` in `STEP_HOOKS`
(VCPO's ESS-scaled learning rate, `reroll.methods.vcpo`), and `step_hooks` builds those
that the objective asks for. Must not know the loss, the batch layout or the schedule
(the schedule's lr is the one the hooks scale).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from reroll.algo import LossInputs
from reroll.registry import METHODS, Registry

STEP_HOOKS = Registry("optimiser step hook", plugins=METHODS)


class StepHook(Protocol):
    """A per-step learning-rate factor from the passes of a mini-batch."""

    def reset(self) -> None: ...  # a mini-batch begins: forget what was observed

    def observe(self, inp: LossInputs) -> None: ...  # one pass's loss inputs

    def lr_factor(self) -> tuple[float, dict[str, float]]: ...  # (factor, its metrics)


def step_hooks(objective) -> list[StepHook]:
    """The hooks ``objective`` asks for: each registered factory's, in name order, where it
    returns one (VCPO's ``ess_lr`` with ``algo.ess_lr``)."""
    hooks = (STEP_HOOKS.get(name)(objective) for name in STEP_HOOKS.names())
    return [h for h in hooks if h is not None]


class OptimiserStep:
    """Clip, check, scale and step ``opt`` over ``params``; ``grad_clip`` 0: no clip."""

    def __init__(self, opt: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter],
                 grad_clip: float, hooks: Sequence[StepHook] = ()):
        self.opt, self.params, self.grad_clip = opt, params, grad_clip
        self.hooks = list(hooks)

    def begin(self) -> None:
        """A mini-batch begins: no gradient, nothing observed."""
        self.opt.zero_grad(set_to_none=True)
        for h in self.hooks:
            h.reset()

    def observe(self, inp: LossInputs) -> None:
        for h in self.hooks:
            h.observe(inp)

    def __call__(self, version: int) -> dict[str, float]:
        """The step; its metrics (``grad_norm``, the hooks'). A non-finite gradient norm
        clears the gradients and raises FloatingPointError (``version`` names the update)."""
        gn = torch.nn.utils.clip_grad_norm_(self.params,
                                            self.grad_clip if self.grad_clip > 0 else 1e30)
        if not torch.isfinite(gn):
            self.opt.zero_grad(set_to_none=True)
            raise FloatingPointError(f"non-finite gradient norm at version {version}")
        factor, metrics = 1.0, {"grad_norm": float(gn)}
        for h in self.hooks:
            f, m = h.lr_factor()
            factor *= f
            metrics.update(m)
        scaled_step(self.opt, factor)
        return metrics


def scaled_step(opt: torch.optim.Optimizer, scale: float) -> None:
    """One optimiser step with every group's lr times ``scale`` for this step alone; the
    schedule's lr is put back after, so factors never compound."""
    if scale == 1.0:
        opt.step()
        return
    lrs = [g["lr"] for g in opt.param_groups]
    for g, lr in zip(opt.param_groups, lrs):
        g["lr"] = lr * scale
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, lrs):
            g["lr"] = lr
