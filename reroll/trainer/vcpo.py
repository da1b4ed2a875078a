"""The trainer's side of VCPO: exact per-sample gradient norms for the OPOB baseline,
and the ESS-scaled learning rate as a hook on the optimiser step.

Owns ``score_grad_sq_norms``: for each sample i of a batch, ||grad_theta sum_t log
pi_theta(o_t)||^2 over its loss tokens and every trainable parameter, from a forward and a
backward pass of that sample alone (cut to its own length; `torch.autograd.grad`, so the
parameters' ``.grad`` is never touched). A loop, because the batched alternatives do not
fit: a vmapped backward through the trainer's forward (``is_grads_batched``) is far
slower, and torch.func's ``vmap(grad)`` needs eager attention (transformers' sdpa mask
code refuses vmap), runs outside the trainer's chunked forward and holds N copies of the
gradient, which a real model cannot.

Also ``opob_inputs`` (what the ``opob`` estimator declares) and ``EssLrHook`` (a
`reroll.trainer.optim_step.StepHook`). The math (ESS, the baseline) is `reroll.algo.vcpo`
and `Objective.lr_scale`; this module must not compute a loss.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from reroll.algo import LossInputs
from reroll.algo.vcpo import seq_log_weights
from reroll.trainer.batch import Batch


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
    parameters. A sample with no loss token has norm 0 and costs no pass."""
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


class EssLrHook:
    """VCPO's ESS-scaled learning rate on each mini-batch's optimiser step: the sequence
    IS weights pi_prox / mu of the samples its passes ran (times their sample weights)
    give the ESS, and the objective's rule (`Objective.lr_scale`) turns it into the step's
    lr factor. Metrics: ``vcpo/ess``, ``vcpo/ess_ratio``, ``vcpo/lr_scale`` and
    ``vcpo/ess_ratio_min`` (the step's ratio; the update keeps the smallest)."""

    def __init__(self, objective):
        self.objective = objective
        self.log_w: list[torch.Tensor] = []

    def reset(self) -> None:
        self.log_w = []

    def observe(self, inp: LossInputs) -> None:
        self.log_w.append(self.objective.seq_log_weights(
            inp.prox_logprobs, inp.behav_logprobs, inp.mask, inp.sample_weights))  # [b]

    def lr_factor(self) -> tuple[float, dict[str, float]]:
        if not self.log_w:
            return 1.0, {}
        scale, metrics = self.objective.lr_scale(torch.cat(self.log_w))
        self.log_w = []
        if metrics:
            metrics = {**metrics, "vcpo/ess_ratio_min": metrics["vcpo/ess_ratio"]}
        return scale, metrics
