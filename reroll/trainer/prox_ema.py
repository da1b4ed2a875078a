"""PPO-EWMA's proximal policy: an exponential moving average of the trainer's past weights.

PPO-EWMA (Hilton, Cobbe and Schulman 2022, "Batch size-invariance for policy optimization")
decouples the trust region's centre from the behaviour policy and makes it a weight average:

    theta_prox <- beta * theta_prox + (1 - beta) * theta     after every update

and pi_prox (the decoupled objective's proximal policy, docs/algorithms.md) is the policy at
theta_prox. In asynchronous RL it is the approximate repair of "Missing Old Logits in
Asynchronous Agentic RL" (Guan et al. 2026): the proximal policy then moves slowly through
the versions the buffered samples came from instead of jumping to the newest.

Owns the averaged copy of the model (`ProxEma`), its update and its state for checkpoints
(``EMA_FILE``). It starts as a copy of the weights it is given; parameters are averaged in
their own dtype (the trainer's weights are float32), buffers copied. Must
not know the objective, batches or the optimiser.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

EMA_FILE = "prox_ema.pt"  # the checkpoint file holding its weights and update count


class ProxEma:
    """theta_prox, kept on the model's device. ``decay`` is beta in [0, 1): 0 would be the
    current weights (the trainer's default pi_prox, without this class)."""

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0.0 < decay < 1.0:
            raise ValueError(f"train.prox_ema must lie in (0, 1) to average, got {decay}")
        self.decay = float(decay)
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.updates = 0

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """theta_prox <- beta theta_prox + (1 - beta) theta, once per distinct parameter
        (tied weights, e.g. an embedding shared with the output layer, are averaged once).
        Buffers are copied, not averaged: they are not trained, and averaging a constant
        (rotary frequencies) would drift it by rounding, away from what a checkpoint keeps."""
        mine, theirs = list(self.model.parameters()), list(model.parameters())
        bufs, their_bufs = list(self.model.buffers()), list(model.buffers())
        if len(mine) != len(theirs) or len(bufs) != len(their_bufs):
            raise ValueError("ProxEma.update: the model's tensors do not match the average's")
        for e, v in zip(mine, theirs):
            e.mul_(self.decay).add_(v.detach(), alpha=1.0 - self.decay)
        for e, v in zip(bufs, their_bufs):
            e.copy_(v)
        self.updates += 1

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the averaged weights (on the CPU) and the update count."""
        return {"decay": self.decay, "updates": self.updates,
                "weights": {k: v.detach().cpu().clone()
                            for k, v in self.model.state_dict().items()}}

    def load(self, state: dict[str, Any]) -> None:
        """Restore `state`'s weights bit for bit; a different decay is refused (it would
        change what every later update averages)."""
        if float(state["decay"]) != self.decay:
            raise ValueError(f"train.prox_ema: the checkpoint averaged with decay "
                             f"{state['decay']}, this run asks {self.decay}")
        self.model.load_state_dict(state["weights"])
        self.updates = int(state["updates"])
