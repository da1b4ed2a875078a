"""The training objective: registered pieces composed into what the trainer calls.

Owns ``LossInputs`` (one micro-batch, aligned on response token positions) and
``Objective``, built from an ``AlgoConfig`` by ``build_objective``. The per-token loss is the
decoupled objective of AReaL (docs/algorithms.md): the trust region against the proximal
policy, the sampler/trainer gap corrected by a separate weight,

    l_t = s_i * w_t * surrogate(pi_theta / pi_prox, A_t),   w_t = correction(pi_prox / mu)

with ``s_i`` the sample's weight (``Rollout.sample_weight``, 1 unless a control or replay
policy set it), aggregated with the global normalisers (weights do not change them), plus ``kl_coef * agg(kl(pi_theta, pi_ref))`` when the
KL penalty sits in the loss. The objective carries VCPO's ESS-scaled learning-rate settings
(``ess_*``), which its optimiser step hook reads (`reroll.methods.vcpo`), and the per-sample
inputs its advantage estimator asks of the trainer (``advantage_inputs``, the estimator's
registry trait ``trainer_inputs``; VCPO's OPOB baseline). The trainer never branches on
component names; everything it needs is a method or a field here. Must not know about models, batches or the optimiser.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from reroll.algo.advantages import ADVANTAGES
from reroll.algo.aggregation import AGGREGATIONS
from reroll.algo.corrections import CORRECTIONS
from reroll.algo.kl import KL_ESTIMATORS, kl_reward_penalty
from reroll.algo.surrogates import SURROGATES, masked_mean

if TYPE_CHECKING:
    from reroll.config import AlgoConfig


@dataclass
class LossInputs:
    """One micro-batch; every tensor is aligned on response token positions."""

    logprobs: Tensor  # [B, T] current policy pi_theta, requires grad
    # [B, T] pi_prox: the weights at the start of this update (PPO-EWMA: their moving
    # average; with version snapshots, a stale token's own version's weights)
    prox_logprobs: Tensor
    behav_logprobs: Tensor  # [B, T] mu: recorded by the engine when it sampled
    advantages: Tensor  # [B, T] per-sample advantage broadcast over its tokens
    mask: Tensor  # [B, T] float, a trainable token's loss weight (1; TreeRL: paths through it)
    n_tokens: float  # trainable tokens in the whole mini-batch (global normaliser)
    n_seqs: float  # sequences in the whole mini-batch (global normaliser)
    ref_logprobs: Tensor | None = None  # [B, T] when kl_coef > 0 and the KL is in the loss
    sample_weights: Tensor | None = None  # [B] per-sample weight of the policy term (1: none)


@dataclass
class Objective:
    """Advantage estimator, surrogate, aggregation, KL and correction, each already bound to
    its hyperparameters (``Registry.bind``)."""

    advantage_fn: Callable[..., tuple[Tensor, Tensor]]
    surrogate_fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    aggregate_fn: Callable[..., Tensor]
    kl_fn: Callable[[Tensor, Tensor], Tensor]
    correction_fn: Callable[..., tuple[Tensor, Tensor, dict[str, Tensor]]]
    kl_coef: float = 0.0
    kl_in_reward: bool = False
    ess_lr: bool = False  # VCPO: scale each mini-batch's learning rate by its ESS
    ess_rule: str = "sqrt"  # a `reroll.methods.vcpo.LR_RULES` name
    ess_base_ratio: float = 1.0
    ess_is_cap: float = 0.0  # clip of the sequence IS weights for the ESS (0: none)
    # per-sample inputs the advantage estimator needs from the trainer (its trait
    # ``trainer_inputs``): (forward, model, batch, sample_weights [N], mini-batch size) ->
    # (inputs {name: [N]}, metrics); None: it needs none
    advantage_inputs: Callable[..., tuple[dict[str, Tensor], dict[str, float]]] | None = None
    pieces_inert: bool = False  # surrogate inert at A = 0 and correction row-local (traits)

    def __post_init__(self) -> None:
        if self.kl_coef < 0:
            raise ValueError(f"algo.kl_coef must be >= 0, got {self.kl_coef}")

    @property
    def needs_ref(self) -> bool:
        """Whether a reference policy's log-probs are needed (in the loss or the reward)."""
        return self.kl_coef > 0

    @property
    def zero_advantage_inert(self) -> bool:
        """Whether a sample whose advantages are all 0 adds exactly nothing to the loss or its
        gradient (it still counts in the global normalisers): the surrogate is 0 at A = 0
        and the correction looks at each sample alone (their registry traits), no KL term
        sits in the loss, and no ESS-scaled learning rate needs every sample's IS weight.
        The trainer then leaves such samples out of its forward and backward passes."""
        kl_in_loss = self.needs_ref and not self.kl_in_reward
        return self.pieces_inert and not kl_in_loss and not self.ess_lr

    def wants(self, name: str) -> bool:
        """Whether the advantage estimator declares the per-sample input ``name`` (e.g.
        ``token_counts``, or OPOB's ``grad_sq_norms``, which costs the trainer extra passes)."""
        return name in inspect.signature(self.advantage_fn).parameters

    def advantages(self, rewards: Tensor, components: Tensor, group_index: Tensor,
                   token_counts: Tensor | None = None, **inputs: Tensor
                   ) -> tuple[Tensor, Tensor]:
        """rewards [N], components [N, K], group_index [N] -> (advantages [N], include [N]).
        ``token_counts`` [N] and the other ``inputs`` (per sample [N], or per token [N, T])
        reach only estimators that declare a parameter of that name (weighing samples by
        tokens, VCPO's OPOB, REINFORCE++'s per-token KL ``token_kl`` with its
        ``token_mask``); the others never see them. An estimator given per-token inputs may
        return per-token advantages [N, T]."""
        given = {"token_counts": token_counts, **inputs}
        extra = {k: v for k, v in given.items() if v is not None and self.wants(k)}
        return self.advantage_fn(rewards, components, group_index, **extra)

    def kl_reward_penalty(self, logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
        """kl_coef * k(t) per token [B, T] (no grad) from behaviour or proximal log-probs [B, T];
        it leaves the reward: per token where the advantage estimator takes ``token_kl``
        (REINFORCE++'s returns), else summed over the response. Zeros when kl_coef = 0."""
        return kl_reward_penalty(self.kl_fn, logprobs, ref_logprobs, mask, self.kl_coef)

    def loss(self, inp: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
        """This micro-batch's share of the mini-batch loss (the shares sum to the whole) and
        its metrics (0-d tensors, means over this micro-batch's trainable tokens)."""
        mask = inp.mask.to(inp.logprobs.dtype)
        weights, kept, metrics = self.correction_fn(inp.prox_logprobs, inp.behav_logprobs, mask)
        # the correction keeps or drops tokens (0/1); a token's loss weight (TreeRL's paths
        # through it, `reroll.methods.treerl`; 1 elsewhere) stays in the mask
        mask = mask * kept.to(mask.dtype)
        per_tok, sur_metrics = self.surrogate_fn(inp.logprobs, inp.prox_logprobs,
                                                 inp.advantages, mask)
        if inp.sample_weights is not None:  # e.g. a replayed or down-weighted sample
            weights = weights * inp.sample_weights.to(weights.dtype)[:, None]
        policy = self.aggregate_fn(weights * per_tok, mask, inp.n_tokens, inp.n_seqs)
        total = policy
        metrics.update(sur_metrics)
        metrics["loss/policy"] = policy.detach()
        if self.needs_ref and not self.kl_in_reward:
            if inp.ref_logprobs is None:
                raise ValueError("Objective.loss: kl_coef > 0 with the KL in the loss needs "
                                 "LossInputs.ref_logprobs")
            # KL on the tokens the policy loss trains on (after any masking by the correction);
            # padded positions are zeroed first so -inf there cannot turn into NaN
            m = mask > 0
            lp = torch.where(m, inp.logprobs, torch.zeros_like(inp.logprobs))
            kl = self.kl_fn(lp, torch.where(m, inp.ref_logprobs, torch.zeros_like(lp)))
            kl_loss = self.aggregate_fn(kl, mask, inp.n_tokens, inp.n_seqs)
            total = total + self.kl_coef * kl_loss
            metrics["loss/kl"] = kl_loss.detach()
            metrics["kl_ref"] = masked_mean(kl.detach(), mask)
        logp = torch.where(mask > 0, inp.logprobs.detach(), torch.zeros_like(mask))
        metrics["entropy_proxy"] = masked_mean(-logp, mask)  # mean -log pi of sampled tokens
        return total, {k: v.detach() for k, v in metrics.items()}


def build_objective(algo_cfg: AlgoConfig) -> Objective:
    """Bind every registered piece named by ``algo_cfg`` to its hyperparameters."""
    a = algo_cfg
    return Objective(
        advantage_fn=ADVANTAGES.bind(a.advantage, a.advantage_args, "algo.advantage_args"),
        surrogate_fn=SURROGATES.bind(a.surrogate, a.surrogate_args, "algo.surrogate_args"),
        aggregate_fn=AGGREGATIONS.bind(a.aggregation, a.aggregation_args, "algo.aggregation_args"),
        kl_fn=KL_ESTIMATORS.bind(a.kl, {}, "algo.kl"),
        correction_fn=CORRECTIONS.bind(a.correction, a.correction_args, "algo.correction_args"),
        kl_coef=float(a.kl_coef),
        kl_in_reward=bool(a.kl_in_reward),
        ess_lr=bool(a.ess_lr),
        ess_rule=a.ess_rule,
        ess_base_ratio=float(a.ess_base_ratio),
        ess_is_cap=float(a.ess_is_cap),
        advantage_inputs=ADVANTAGES.trait(a.advantage, "trainer_inputs"),
        pieces_inert=bool(SURROGATES.trait(a.surrogate, "inert_at_zero_advantage", False)
                          and CORRECTIONS.trait(a.correction, "row_local", False)),
    )
