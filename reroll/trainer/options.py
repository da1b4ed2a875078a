"""The trainer's options: every setting of a policy update that is not a model, an
objective or a tokenizer, in one documented dataclass (`TrainerOptions`).

Owns the fields, their defaults and the checks that need no model. Must not know the
config file (`reroll.build` turns a ``RunConfig`` into one) nor how the update runs
(`reroll.trainer.step`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class TrainerOptions:
    """How a `Trainer` updates the policy. ``pad_id`` and ``lr`` have no default."""

    pad_id: int
    """Token id that right-pads a batch (the tokenizer's pad token)."""
    lr: float
    """AdamW's base learning rate (times the schedule's factor at each update)."""
    weight_decay: float = 0.0
    """AdamW's weight decay."""
    warmup_steps: int = 0
    """Updates of linear learning-rate warm-up (the first gets 1 / warmup_steps)."""
    schedule: str = "constant"
    """Learning-rate schedule after the warm-up, a name in
    `reroll.trainer.schedules.SCHEDULES` ("constant", "linear", ...)."""
    total_steps: int = 0
    """Updates a schedule that needs an end (trait ``needs_steps``, e.g. "linear") spans;
    RL steps, not mini-batches."""
    grad_clip: float = 1.0
    """Global gradient-norm clip of each optimiser step (0: none)."""
    minibatches: int = 1
    """Optimiser steps per update: the batch is cut into this many consecutive
    mini-batches, all trained from the proximal log-probs of the update's start."""
    micro_batch: int = 64
    """Samples per forward and backward pass, at most (does not change the gradient)."""
    micro_batch_tokens: int = 0
    """Token budget of a pass: > 0 sorts a mini-batch's samples by length and cuts them
    into passes of at most this many positions (`reroll.trainer.micro_batches`); 0:
    ``micro_batch`` samples at a time, in order."""
    temperature: float = 1.0
    """Sampling temperature the log-probs are taken at (the engine's)."""
    reuse_prox: bool = True
    """With one mini-batch and no KL in the reward, take the proximal log-probs from the
    loss's own forward (detached: the same weights) instead of a separate pass; False
    always runs the separate pass."""
    skip_inert: bool = True
    """Leave samples that cannot move the weights (all advantages 0 under an objective for
    which that means loss 0 and gradient 0, or no trainable token) out of the loss's
    passes; they still count in the global normalisers, so the update is the same up to
    float rounding."""
    logprob_chunk: int = 0
    """Tokens of logits made at a time (0: sized from the vocabulary,
    `reroll.trainer.logprobs`)."""
    share_prompt: bool = False
    """Forward the samples of a pass that share a prompt as one packed row holding the
    prompt once (`reroll.trainer.shared_prompt`), where that costs fewer FLOPs; the same
    log-probs up to float rounding."""
    autocast_dtype: torch.dtype | None = None
    """Forward and backward under ``torch.autocast`` at this dtype (bf16) while the weights
    and AdamW's state stay in the model's own dtype; None: no autocast."""
    publish_dtype: torch.dtype | None = None
    """Dtype of the weights handed to engines; None: ``autocast_dtype``, else the
    weights' own."""
    fused_optimizer: bool = True
    """AdamW's fused kernel (`reroll.trainer.sft.adamw`)."""
    prox_ema: float = 0.0
    """PPO-EWMA: > 0 takes the proximal log-probs from an exponential moving average of the
    weights with this decay, updated after every update (`reroll.trainer.prox_ema`); 0:
    pi_prox is the weights at the start of the update."""
    old_snapshots: int = 0
    """Per-version old log-probs: > 0 keeps weight snapshots of at most this many policy
    versions (the current one included) and takes each stale token's pi_prox under its own
    version's weights (`reroll.trainer.snapshots`); 0: none."""
    snapshot_lag: int = 0
    """The largest version lag a trained token can have (the admission bound: the run's
    max_staleness, one more with overprovision): snapshots older than it are released even
    when referenced, and without the loop's referenced set every newer one is kept."""

    @property
    def published_dtype(self) -> torch.dtype | None:
        """The dtype `Trainer.weights` publishes in (None: the weights' own)."""
        return self.publish_dtype or self.autocast_dtype
