"""The trainer's side of VCPO (ALGORITHMS.md 2.6): exact per-sample gradient norms for the
OPOB baseline, and an optimiser step at an ESS-scaled learning rate.

Owns ``score_grad_sq_norms``: for each sample i of a batch, ||grad_theta sum_t log
pi_theta(o_t)||^2 over its loss tokens and every trainable parameter, from a forward and a
backward pass of that sample alone (cut to its own length; `torch.autograd.grad`, so the
parameters' ``.grad`` is never touched). Measured at 0.4M parameters, 128 samples, one CPU
core: this loop 0.86 s (one batched forward and backward of them: 0.12 s); a vmapped
backward through the trainer's forward (``is_grads_batched``) 21 s; torch.func's
``vmap(grad)`` 0.39 s, but only with eager attention (transformers' sdpa mask code refuses
vmap), outside the trainer's chunked forward, and holding N copies of the gradient, which a
real model cannot. So the loop it is.

Also ``opob_inputs`` (what the ``opob`` estimator declares) and ``scaled_step``. The math
(ESS, the baseline) is `reroll.algo.vcpo`; this module must not know about losses.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

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


def scaled_step(opt: torch.optim.Optimizer, scale: float) -> None:
    """One optimiser step with every group's lr times ``scale`` for this step alone (VCPO's
    ESS factor); the schedule's lr is put back after, so factors never compound."""
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
