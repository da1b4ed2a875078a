"""VCPO (Huang et al. 2026, "Stable Asynchrony"): variance controls for off-policy updates,
in one module: its math, its trainer side and its registrations.

The paper's two controls, each a separate option (docs/algorithms.md, "VCPO"):

* the ESS-scaled learning rate (``algo.ess_lr``). Each sample's sequence importance weight
  ``w_i = exp(sum_t [log pi_prox(o_t) - log mu(o_t)])`` over its loss tokens (optionally
  clipped at a cap, then times the sample's own weight) is kept as a log: a long or stale
  sequence's weight overflows a float long before its log does. The effective sample size
  ``ESS = (sum w)^2 / sum w^2`` of a mini-batch gives ``rho = ESS / B`` and the factor
  ``min(1, rho / rho_base)^(1/2)`` (``LR_RULES``: ``sqrt`` for Adam-type optimisers,
  ``linear``) on that mini-batch's optimiser step: `EssLrHook`, registered as the optimiser
  step hook ``ess_lr`` (`reroll.trainer.optim_step.STEP_HOOKS`);
* the off-policy optimal baseline (OPOB), the advantage estimator ``opob``:
  ``b* = sum_i u_i R_i / sum_i u_i`` with ``u_i = w_i^2 ||grad log pi_theta(tau_i)||^2``
  (optionally ``/ L_i^2``) per group or per mini-batch, ``A_i = (R_i - b*) / (std + eps)``
  with the scope's population std, as the paper's reference computes it. Its per-sample
  inputs come from the trainer through the estimator's trait ``trainer_inputs``
  (`opob_inputs`): exact squared gradient norms, one forward and backward pass per sample.

Where reroll differs: the baseline is clamped into its scope's reward range (a convex
combination, so only rounding is removed), and ``unbiased_std = true`` keeps the (n - 1)
std that GRPO uses. Imports the stages it plugs into (advantages, the trainer's batch and
optimiser step); no stage imports it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import Tensor

from reroll.algo import LossInputs
from reroll.algo.advantages import ADVANTAGES
from reroll.algo.groups import check_inputs, dense_ids, group_mean, group_sizes, group_std
from reroll.registry import Registry
from reroll.trainer.batch import Batch
from reroll.trainer.optim_step import STEP_HOOKS

LR_RULES = Registry("ESS learning-rate rule")


@torch.no_grad()
def seq_log_weights(prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor,
                    sample_weights: Tensor | None = None, cap: float = 0.0) -> Tensor:
    """log w_i [B] of each sample: sum over its loss tokens of log pi_prox - log mu, clipped
    at ``log cap`` when ``cap > 0``, plus log of its sample weight [B] (1: none). A sample with
    no loss token, or with weight 0, is out of the estimate: -inf.

    prox_logprobs, behav_logprobs, mask: [B, T]."""
    if prox_logprobs.shape != behav_logprobs.shape or prox_logprobs.shape != mask.shape:
        raise ValueError(f"seq_log_weights: prox_logprobs {tuple(prox_logprobs.shape)}, "
                         f"behav_logprobs {tuple(behav_logprobs.shape)} and mask "
                         f"{tuple(mask.shape)} must share one [B, T]")
    m = mask > 0
    diff = torch.where(m, prox_logprobs.double() - behav_logprobs.double(),
                       torch.zeros((), dtype=torch.float64, device=mask.device))
    log_w = diff.sum(-1)  # [B]
    if cap > 0:
        log_w = log_w.clamp(max=math.log(cap))
    if sample_weights is not None:
        log_w = log_w + sample_weights.double().log()  # weight 0: -inf
    return torch.where(m.any(-1), log_w, torch.full_like(log_w, -math.inf))


def _shifted(log_w: Tensor) -> Tensor:
    """exp(log_w - max log_w) [N] in float64: weights scaled so the largest is 1 (ESS and
    OPOB are ratios, so the scale cancels); all exactly 1 when every log_w is equal."""
    return (log_w.double() - log_w.double().max()).exp()


@torch.no_grad()
def effective_sample_size(log_w: Tensor) -> tuple[float, float]:
    """(ESS, ESS / B) of the samples with a finite log weight [N]; B counts them. With no
    such sample there is nothing to weigh: (0.0, 1.0), which leaves a learning rate alone."""
    log_w = log_w[torch.isfinite(log_w)]
    if log_w.numel() == 0:
        return 0.0, 1.0
    u = _shifted(log_w)  # [B]
    ess = float(u.sum() ** 2 / (u * u).sum())
    return ess, ess / log_w.numel()


@LR_RULES.register("sqrt")
def sqrt_rule(ratio: float) -> float:
    """lr factor sqrt(ratio): Adam normalises the gradient's scale, so its step variance
    shrinks with the square root of the effective batch."""
    return ratio ** 0.5


@LR_RULES.register("linear")
def linear_rule(ratio: float) -> float:
    """lr factor = ratio (plain SGD's step variance is linear in 1 / batch)."""
    return ratio


def ess_lr_scale(ess_ratio: float, base_ratio: float, rule: str) -> float:
    """The factor on a mini-batch's learning rate: rule(min(1, ess_ratio / base_ratio)).
    ``base_ratio`` in (0, 1]: ESS ratios at or above it keep the full learning rate."""
    if not 0.0 < base_ratio <= 1.0:
        raise ValueError(f"ess_lr_scale: base_ratio must be in (0, 1], got {base_ratio}")
    return LR_RULES.get(rule)(min(1.0, ess_ratio / base_ratio))


@torch.no_grad()
def opob_baseline(values: Tensor, log_w: Tensor, grad_sq_norms: Tensor, scope: Tensor,
                  lengths: Tensor | None = None) -> Tensor:
    """b* of each sample's scope, per sample [N] (float64):

        b*_s = sum_{i in s} u_i v_i / sum_{i in s} u_i,   u_i = w_i^2 ||g_i||^2 (/ L_i^2)

    values [N] (rewards), log_w [N] (log sequence IS weights; -inf: left out),
    grad_sq_norms [N] (||grad log pi(tau_i)||^2), scope [N] (any integer ids: a group or a
    mini-batch), lengths [N] (loss tokens, for the 1/L^2 factor; a sample with none is left
    out). A scope whose weights are all 0 (every gradient norm 0, or every sample left out)
    takes the plain mean of its values: with equal weights that is what the formula gives.
    b* is a convex combination, so it is clamped into [min, max] of its scope's values (an
    all-equal group gets exactly its value back, not one rounded by the weights)."""
    v = values.double()
    ids, n = dense_ids(scope)
    log_u = 2.0 * log_w.double() + grad_sq_norms.double().log()  # [N]; norm 0: -inf
    if lengths is not None:
        L = lengths.double()
        log_u = torch.where(L > 0, log_u - 2.0 * L.clamp(min=1.0).log(),
                            torch.full_like(log_u, -math.inf))
    log_u = torch.nan_to_num(log_u, nan=-math.inf)
    f64 = dict(dtype=torch.float64, device=v.device)
    top = torch.full((n,), -math.inf, **f64).scatter_reduce(
        0, ids, log_u, "amax")  # [S]
    u = torch.where(torch.isfinite(top[ids]), (log_u - top[ids]).exp(),
                    torch.zeros_like(log_u))  # [N], the largest of each scope is 1
    den = torch.zeros(n, **f64).index_add_(0, ids, u)  # [S]
    num = torch.zeros(n, **f64).index_add_(0, ids, u * v)  # [S]
    size = torch.zeros(n, **f64).index_add_(0, ids, torch.ones_like(v))  # [S]
    mean = torch.zeros(n, **f64).index_add_(0, ids, v) / size  # [S]
    b = torch.where(den > 0, num / den.clamp(min=1e-300), mean)  # [S]
    lo = torch.full((n,), math.inf, **f64).scatter_reduce(0, ids, v, "amin")
    hi = torch.full((n,), -math.inf, **f64).scatter_reduce(0, ids, v, "amax")
    return torch.minimum(torch.maximum(b, lo), hi)[ids]


def _check_opob_args(*, scope: str = "group", **_: object) -> None:
    """The load-time check of ``opob``'s non-numeric hyperparameters (registry trait
    ``check``, called by `reroll.config_checks`)."""
    if scope not in ("group", "minibatch"):
        raise ValueError(f"advantage 'opob': scope must be group or minibatch, got {scope!r}")


def opob(rewards: Tensor, components: Tensor, group_index: Tensor,
         token_counts: Tensor | None = None, seq_log_weights: Tensor | None = None,
         grad_sq_norms: Tensor | None = None, minibatch_index: Tensor | None = None, *,
         scope: str = "group", norm_by_std: bool = True, length_norm: bool = False,
         is_cap: float = 0.0, eps: float = 1e-6, unbiased_std: bool = False
         ) -> tuple[Tensor, Tensor]:
    """VCPO's off-policy optimal baseline: A_i = (R_i - b*_s) / (std_s R + eps), with b*_s
    the variance-minimising baseline of sample i's scope (``opob_baseline``).

    ``scope``: "group" (its prompt's samples) or "minibatch" (the samples of its trainer
    mini-batch). ``norm_by_std``: divide by the scope's reward std (False: A = R - b*), the
    population std (divisor n, as the paper's reference), or with ``unbiased_std`` the
    (n - 1) one GRPO uses (a singleton scope then divides by 1). ``length_norm``: weights / L_i^2. ``is_cap`` (> 0): clip w_i there for the
    baseline. The trainer supplies ``seq_log_weights`` (log w_i [N] at the weights the update
    starts from, the sample weight folded in), ``grad_sq_norms`` [N] (||grad_theta sum_t
    log pi_theta(o_t)||^2 over the sample's loss tokens, same weights), ``token_counts`` [N]
    and ``minibatch_index`` [N]. With every w_i and ||g_i|| equal, b* is the scope's mean."""
    where = "advantage 'opob'"
    check_inputs(rewards, components, group_index, where)
    _check_opob_args(scope=scope)
    if seq_log_weights is None or grad_sq_norms is None:
        raise ValueError(f"{where}: needs seq_log_weights and grad_sq_norms per sample (the "
                         f"trainer computes them for an estimator that declares them)")
    ids = group_index
    if scope == "minibatch":
        if minibatch_index is None:
            raise ValueError(f"{where}: scope 'minibatch' needs minibatch_index per sample")
        ids = minibatch_index
    log_w = seq_log_weights.double()
    if is_cap > 0:
        log_w = log_w.clamp(max=math.log(is_cap))
    lengths = token_counts if length_norm else None
    if length_norm and lengths is None:
        raise ValueError(f"{where}: length_norm needs token_counts per sample")
    b = opob_baseline(rewards, log_w, grad_sq_norms, ids, lengths)  # [N]
    adv = rewards.double() - b
    if norm_by_std:
        adv = adv / (scope_std(rewards.double(), ids, unbiased_std) + eps)
    return adv.to(rewards.dtype), torch.ones(rewards.shape[0], dtype=torch.bool,
                                             device=rewards.device)


def scope_std(x: Tensor, scope: Tensor, unbiased: bool = False) -> Tensor:
    """Std of x [N] within each scope (any integer ids [N]), per sample [N]: the population
    one (divisor n), or with ``unbiased`` the (n - 1) one (`reroll.algo.groups.group_std`)."""
    ids, n = dense_ids(scope)
    if unbiased:
        return group_std(x, ids, n)
    x64 = x.to(torch.float64)
    sq = torch.zeros(n, dtype=torch.float64, device=x.device).index_add_(
        0, ids, (x64 - group_mean(x64, ids, n)) ** 2)  # [S]
    return (sq / group_sizes(ids, n)).sqrt()[ids].to(x.dtype)


# ---- the trainer's side ------------------------------------------------------------------
def one_sample(batch: Batch, i: int) -> Batch:
    """Row i of a right-padded batch, cut to its own length (no padding left)."""
    n = int(batch.attention_mask[i].sum())
    return Batch(batch.input_ids[i:i + 1, :n], batch.attention_mask[i:i + 1, :n],
                 batch.targets[i:i + 1, :n - 1], batch.mask[i:i + 1, :n - 1],
                 batch.behav_logprobs[i:i + 1, :n - 1], batch.versions[i:i + 1, :n - 1])


def score_grad_sq_norms(forward: Callable[[Batch], torch.Tensor], params: list[torch.Tensor],
                        batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """(squared gradient norms [N] float64 on the CPU, log-probs [N, T] detached, 0 past each
    sample's length) of the batch's samples. ``forward(batch) -> log-probs [b, T]`` is the
    trainer's own (same temperature, chunking and autocast); ``params`` the trainable
    parameters. A sample with no loss token has norm 0 and costs no pass.

    One forward and backward pass per sample, cut to its own length (`torch.autograd.grad`,
    so the parameters' ``.grad`` is never touched): the batched alternatives do not fit. A
    vmapped backward through the trainer's forward (``is_grads_batched``) is far slower, and
    torch.func's ``vmap(grad)`` needs eager attention (transformers' sdpa mask code refuses
    vmap), runs outside the trainer's chunked forward and holds N copies of the gradient,
    which a real model cannot."""
    n, width = batch.mask.shape
    sq = torch.zeros(n, dtype=torch.float64)
    logps = torch.zeros(n, width, dtype=torch.float32, device=batch.mask.device)
    for i in range(n):
        if not bool(batch.mask[i].any()):
            continue
        sub = one_sample(batch, i)
        with torch.enable_grad():
            lp = forward(sub)  # [1, t]
            grads = torch.autograd.grad((lp * sub.mask).sum(), params, allow_unused=True)
        sq[i] = float(torch.stack([g.detach().double().pow(2).sum()
                                   for g in grads if g is not None]).sum())
        logps[i, :lp.shape[1]] = lp.detach().float()[0]
    return sq, logps


def opob_inputs(forward: Callable[[Batch], torch.Tensor], model: torch.nn.Module, batch: Batch,
                sample_weights: torch.Tensor, mb_size: int
                ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """(per-sample inputs [N] of the ``opob`` estimator, metrics), at the model's current
    weights (the update's pi_prox): squared score-gradient norms, log sequence IS weights
    pi_prox / mu with the sample weight [N] folded in, and each sample's mini-batch (of
    ``mb_size`` consecutive samples)."""
    start = time.perf_counter()
    params = [p for p in model.parameters() if p.requires_grad]
    sq, logp = score_grad_sq_norms(forward, params, batch)  # [N], [N, T]
    log_w = seq_log_weights(logp, batch.behav_logprobs, batch.mask, sample_weights)  # [N]
    has = batch.mask.sum(-1).cpu() > 0  # [N]
    metrics = {"vcpo/sample_grad_norm_mean": float(sq[has].sqrt().mean()) if has.any() else 0.0,
               "time/vcpo_grad_norms_s": time.perf_counter() - start}
    return {"grad_sq_norms": sq, "seq_log_weights": log_w.cpu(),
            "minibatch_index": torch.arange(len(batch)) // mb_size}, metrics


ADVANTAGES.register("opob", ranges={"is_cap": "[0, inf)", "eps": "[0, 1]"},
                    check=_check_opob_args, trainer_inputs=opob_inputs)(opob)
opob.group_normalised = True  # its default scope's baseline is the group's own samples


class EssLrHook:
    """VCPO's ESS-scaled learning rate on each mini-batch's optimiser step (a
    `reroll.trainer.optim_step.StepHook`): the sequence IS weights pi_prox / mu of the
    samples its passes ran (clipped at ``is_cap`` > 0, times their sample weights) give the
    ESS, and ``rule`` (an `LR_RULES` name) with ``base_ratio`` turns it into the step's lr
    factor (`ess_lr_scale`). Metrics: ``vcpo/ess``, ``vcpo/ess_ratio``, ``vcpo/lr_scale``
    and ``vcpo/ess_ratio_min`` (the step's ratio; the update keeps the smallest)."""

    def __init__(self, rule: str = "sqrt", base_ratio: float = 1.0, is_cap: float = 0.0):
        LR_RULES.get(rule)  # an unknown rule fails here, naming the registered ones
        self.rule, self.base_ratio, self.is_cap = rule, base_ratio, is_cap
        self.log_w: list[torch.Tensor] = []

    def weights(self, prox_logprobs: Tensor, behav_logprobs: Tensor, mask: Tensor,
                sample_weights: Tensor | None = None) -> Tensor:
        """log w_i [B]: each sample's sequence IS weight pi_prox / mu over its loss tokens
        [B, T], clipped at ``is_cap`` (> 0), times its sample weight [B]."""
        return seq_log_weights(prox_logprobs, behav_logprobs, mask, sample_weights, self.is_cap)

    def scale(self, log_weights: Tensor) -> tuple[float, dict[str, float]]:
        """The factor on one mini-batch's learning rate from its samples' log sequence IS
        weights [n] (`weights`), and its metrics."""
        ess, ratio = effective_sample_size(log_weights)
        scale = ess_lr_scale(ratio, self.base_ratio, self.rule)
        return scale, {"vcpo/ess": ess, "vcpo/ess_ratio": ratio, "vcpo/lr_scale": scale}

    def reset(self) -> None:
        self.log_w = []

    def observe(self, inp: LossInputs) -> None:
        self.log_w.append(self.weights(inp.prox_logprobs, inp.behav_logprobs, inp.mask,
                                       inp.sample_weights))  # [b]

    def lr_factor(self) -> tuple[float, dict[str, float]]:
        if not self.log_w:
            return 1.0, {}
        scale, metrics = self.scale(torch.cat(self.log_w))
        self.log_w = []
        return scale, {**metrics, "vcpo/ess_ratio_min": metrics["vcpo/ess_ratio"]}


@STEP_HOOKS.register("ess_lr")
def ess_lr_hook(objective) -> EssLrHook | None:
    """The hook for an objective with ``ess_lr`` on (``algo.ess_lr``), else None."""
    if not objective.ess_lr:
        return None
    return EssLrHook(objective.ess_rule, objective.ess_base_ratio, objective.ess_is_cap)
