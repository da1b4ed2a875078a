"""The train step: complete, scored groups -> one policy update (decoupled objective).

Owns the order of operations of an update: rewards -> advantages (a pure function of the
groups, never stored) -> collate -> proximal log-probs with the weights at the start of the
update (a forward pass of their own only with several mini-batches or a KL penalty in the
reward; with one mini-batch they are the loss forward's, detached; under PPO-EWMA the weight
average's, `reroll.trainer.prox_ema`; with version snapshots each stale token's under its own
version's weights, `reroll.trainer.snapshots`) -> per-token advantages
(`reroll.trainer.credit`: the scalar broadcast, or a tree's segments) -> mini-batches of
micro-batches (samples that cannot move the weights left out of the passes, still counted
in the normalisers) -> each mini-batch's optimiser step (`reroll.trainer.optim_step`: clip,
AdamW, at an lr its hooks may scale for that step, e.g. VCPO's ESS; VCPO's OPOB estimator
first gets per-sample gradient norms). Metrics combine over the passes as
`reroll.trainer.reductions` declares; the options are `reroll.trainer.options`. The math
is the `Objective` from `reroll.algo`; this file only looks it up and feeds it. Knows
nothing of engines or scheduling; checkpoints go through `reroll.trainer.checkpoint` into
the run directory the caller names.

`TrainerHandle` is everything the loop asks of a trainer. `Trainer` is one (in the caller's
process); `reroll.runtime.ray.RayTrainer` is another (a proxy to a Trainer in a Ray actor).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from reroll.algo import LossInputs
from reroll.rollout import Group
from reroll.trainer import checkpoint, credit, shared_prompt
from reroll.trainer.batch import Batch, collate, flatten, token_logprobs_and_entropy
from reroll.trainer.metrics import version_lag_metrics
from reroll.trainer.micro_batches import micro_slices, plan_micro_batches
from reroll.trainer.optim_step import OptimiserStep, step_hooks
from reroll.trainer.options import TrainerOptions
from reroll.trainer.precision import autocast
from reroll.trainer.prox_ema import EMA_FILE, ProxEma
from reroll.trainer.reductions import PassCounts, UpdateMetrics
from reroll.trainer.schedules import check_schedule, lr_factor
from reroll.trainer.sft import adamw
from reroll.trainer.snapshots import SNAPSHOT_FILE, VersionSnapshots, record_old_logprobs

_DECIDE = object()  # `Trainer._forward`: decide the batch's packing there


class TrainerHandle(Protocol):
    """What the loop needs from the trainer, wherever the trainer runs."""

    @property
    def version(self) -> int: ...  # policy version: number of updates made

    def step(self, groups: Sequence[Group], refs: set[int] | None = None) -> dict[str, float]: ...

    def weights(self, trained_only: bool = False, adapters: bool = False) -> Any: ...

    def save_checkpoint(self, run_dir: Path, step: int, state: dict[str, Any],
                        groups: Sequence[Group]) -> Path: ...

    def policy(self) -> torch.nn.Module: ...  # a module with the current weights (evaluation)

    def close(self) -> None: ...


@contextlib.contextmanager
def checkpointed_layers_training(model: torch.nn.Module) -> Iterator[None]:
    """Let transformers' activation checkpointing act on a model in eval mode.

    transformers checkpoints a decoder layer only while ``layer.training``; the trainer runs
    the model in eval mode (no dropout, so proximal and current log-probs are one function).
    So, while a forward that builds a graph runs, the checkpointed layers alone are flagged
    training; their submodules, where dropout lives, stay in eval mode (`build_trainer`
    refuses checkpointing for a model configured with dropout, which a layer's own forward
    might apply). A no-op without activation checkpointing or without autograd."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    layers = [m for m in model.modules()
              if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing
              and not m.training] if torch.is_grad_enabled() else []
    for m in layers:
        m.training = True
    try:
        yield
    finally:
        for m in layers:
            m.training = False


class Trainer:
    """The policy update of ``model`` under ``objective``, as ``options`` (`TrainerOptions`)
    say. The model's device is the trainer's: batches are collated on the CPU and copied
    there. ``tokenizer``: saved next to the weights in checkpoints; ``ref_model``: the
    reference policy (an objective with a KL penalty needs one); ``version``: updates made
    so far (a resume's). Micro-batches (`plan_micro_batches`): ``micro_batch`` samples at a
    time in order, or with ``micro_batch_tokens`` > 0 sorted by length under that token
    budget; each is padded to its own longest sequence, not the batch's. With
    ``share_prompt`` and a budget, the budget sorts by prompt, so that a prompt's samples
    stay in one micro-batch."""

    def __init__(self, model: torch.nn.Module, objective, options: TrainerOptions, *,
                 tokenizer=None, ref_model: torch.nn.Module | None = None, version: int = 0):
        o = self.options = options
        self.model, self.objective, self.ref_model = model, objective, ref_model
        self.tokenizer, self.version = tokenizer, version
        self.device = next(model.parameters()).device
        self.publish_dtype = o.published_dtype
        why = shared_prompt.refusal(model) if o.share_prompt else None
        if why is not None:
            raise ValueError(f"train.share_prompt cannot run on this model: {why}")
        self._widths = shared_prompt.widths(model)
        # the trainable parameters: all of them, or a LoRA policy's adapters (`reroll.lora`)
        params = [p for p in model.parameters() if p.requires_grad]
        self.opt = adamw(params, lr=o.lr, weight_decay=o.weight_decay,
                         fused=o.fused_optimizer)
        self.optimiser_step = OptimiserStep(self.opt, params, o.grad_clip,
                                            step_hooks(objective))
        # counts updates, so it resumes with the optimiser state (LambdaLR's own counter
        # does not); an unknown schedule, or a decay without its end, fails here
        check_schedule(o.schedule, o.total_steps, "train.schedule")
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda k: lr_factor(
            k, steps=o.total_steps, warmup_steps=o.warmup_steps, schedule=o.schedule))
        if objective.needs_ref and ref_model is None:
            raise ValueError("the objective needs a reference model (kl_coef > 0)")
        # PPO-EWMA: pi_prox from a moving average of past weights (None: the current ones)
        self.prox_ema = ProxEma(model, o.prox_ema) if o.prox_ema > 0 else None
        # per-version old log-probs: each stale token's pi_prox under its own version's weights
        self.snapshots = VersionSnapshots(model, o.old_snapshots, o.snapshot_lag) \
            if o.old_snapshots > 0 else None

    def _forward(self, model: torch.nn.Module, batch: Batch, entropy: bool = False,
                 packing=_DECIDE) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(log-probs [b, T], entropies [b, T] or None): the one function proximal, reference
        and current log-probs all come from (same chunking, same autocast). ``packing``:
        `_packing`'s answer for ``batch`` where the caller already has it."""
        with autocast(self.device, self.options.autocast_dtype), \
                checkpointed_layers_training(model):
            plan = self._packing(batch) if packing is _DECIDE else packing
            if plan is not None:
                return shared_prompt.shared_prompt_logprobs(
                    model, batch.input_ids, *plan, batch.targets.shape[1],
                    self.options.temperature, self.options.logprob_chunk, entropy)
            return token_logprobs_and_entropy(model, batch, self.options.temperature,
                                              self.options.logprob_chunk, entropy)

    def _packing(self, batch: Batch, lengths: list[int] | None = None):
        """(lengths, prompt lengths, prompt ids) when this batch goes packed by prompt
        (``share_prompt`` and it costs fewer FLOPs, `shared_prompt.pays`), else None."""
        if not self.options.share_prompt or batch.prompt_ids is None:
            return None
        if lengths is None:
            lengths = batch.attention_mask.sum(-1).tolist()
        plan = (lengths, batch.prompt_lens.tolist(), batch.prompt_ids.tolist())
        return plan if shared_prompt.pays(*plan, *self._widths) else None

    @torch.no_grad()
    def _logprobs(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """[N, T] log-probs of every sample (0 on padding), micro-batch by micro-batch."""
        out = torch.zeros(batch.targets.shape, dtype=torch.float32, device=self.device)
        lengths = batch.attention_mask.sum(-1).tolist()
        for sel in self._plan(lengths, torch.arange(len(batch)), _prompts(batch)):
            sel = sel.to(self.device)
            logp = self._forward(model, batch.slice(sel).trim())[0]  # [b, t]
            out[sel, :logp.shape[1]] = logp.float()
        return out

    def _plan(self, lengths: list[int], run: torch.Tensor,
              prompts: tuple[list[int], list[int]] | None) -> list[torch.Tensor]:
        """The samples ``run`` (indices [n] on the CPU) as micro-batches of indices. Under
        ``share_prompt`` (``prompts``: each sample's prompt id and length) a token budget keeps
        the samples of a prompt together and counts the positions of the layout each pass
        runs in (packed rows where they cost fewer FLOPs, `shared_prompt.PackedCost`)."""
        idx = run.tolist()
        size = [lengths[i] for i in idx]
        units = cost = None
        rows, tokens = self.options.micro_batch, self.options.micro_batch_tokens
        if self.options.share_prompt and prompts is not None and tokens > 0:
            units = [prompts[0][i] for i in idx]
            cost = shared_prompt.PackedCost(size, [prompts[1][i] for i in idx], units,
                                            *self._widths)
        return [run[torch.tensor(p, dtype=torch.long)] for p in plan_micro_batches(
            size, rows, tokens, units, cost)]

    def step(self, groups: Sequence[Group], referenced: set[int] | None = None) -> dict[str, float]:
        o = self.options
        rollouts, rewards, comps, gidx = flatten(groups)
        batch = collate(rollouts, o.pad_id).to(self.device)
        self.model.eval()  # no dropout: proximal and current log-probs share one function
        ref = self._logprobs(self.ref_model, batch) if self.ref_model is not None else None
        kl_reward = ref is not None and self.objective.kl_in_reward
        # pi_prox is the policy at the start of the update. With one mini-batch the loss's own
        # forward runs at exactly those weights, so its detached log-probs are pi_prox and a
        # separate forward pass would compute the same numbers again (TRL and verl skip it too).
        prox = None
        if self.prox_ema is not None:
            prox = self._logprobs(self.prox_ema.model, batch)  # [N, T] at theta_prox
        elif o.minibatches > 1 or kl_reward or not o.reuse_prox:
            prox = self._logprobs(self.model, batch)  # [N, T]
        metrics: dict[str, float] = {}
        old = None  # (pi_train,v [N, T], where computed [N, T]) with snapshots
        if self.snapshots is not None:
            s, v = self.snapshots, self.version  # held: referenced + this batch's versions
            s.keep(v, self.model, referenced, set(batch.versions[batch.mask > 0].tolist()))
            *old, m = s.old_logprobs(batch, v, self._logprobs)
            s.release(v, referenced), record_old_logprobs(rollouts, *old)
            metrics.update(m, **s.metrics())
        extra: dict[str, torch.Tensor] = {}
        if kl_reward:
            pen = self.objective.kl_reward_penalty(prox, ref, batch.mask)  # [N, T]
            if self.objective.wants("token_kl"):  # the estimator places it per token
                extra.update(token_kl=pen.cpu(), token_mask=batch.mask.cpu())
            else:  # the sequence's KL folded into its reward before advantages (RLOO)
                rewards = rewards - pen.sum(-1).cpu()
        sample_w = torch.tensor([r.sample_weight for r in rollouts],
                                dtype=torch.float32).to(self.device)  # [N]
        n = len(batch)
        mb_size = -(-n // o.minibatches)
        if self.objective.advantage_inputs is not None:  # e.g. VCPO's OPOB: a pass per sample
            inputs, m = self.objective.advantage_inputs(
                lambda b: self._forward(self.model, b)[0], self.model, batch, sample_w, mb_size)
            extra.update(inputs)
            metrics.update(m)
        if self.objective.wants("mean_logprobs"):  # XRPO's novelty: mean behaviour log-prob
            tok = batch.mask.sum(-1).clamp(min=1.0)  # [N]
            lp = torch.where(batch.mask > 0, batch.behav_logprobs, 0.0)  # [N, T]
            extra["mean_logprobs"] = ((lp * batch.mask).sum(-1) / tok).cpu()
        # advantages on the CPU (per-sample scalars); per-token tensors on the model's device
        adv, include = self.objective.advantages(rewards, comps, gidx,
                                                 batch.mask.sum(-1).cpu(), **extra)  # [N], [N]
        batch.mask = batch.mask * include.float().to(self.device)[:, None]
        per_tok = adv if adv.dim() == 2 else None  # [N, T]: per-token returns (REINFORCE++)
        if per_tok is not None:
            m = batch.mask.cpu()
            adv = (per_tok * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # [N] for the metrics
        # the scalar broadcast over each sample's tokens; tree groups with segment credit get
        # their own per-token advantages and train each shared token once (`credit`)
        adv_tok, batch.mask, adv, tree_m = credit.token_advantages(groups, rewards, adv,
                                                                   batch.mask)
        if per_tok is not None:
            if tree_m:
                raise ValueError("per-token returns (algo.advantage_args kl_returns = 'token' "
                                 "with the KL in the reward) cannot take tree segment credit; "
                                 "set kl_returns = 'folded'")
            adv_tok = per_tok.to(batch.mask.device, adv_tok.dtype) * batch.mask
        # several optimiser steps per update: a non-finite loss in a later mini-batch must not
        # leave the earlier ones applied (the version would not say so), so keep a copy
        saved = self._snapshot() if o.minibatches > 1 else None
        live = self._live(adv_tok, batch.mask, sample_w)  # [N] bool: samples that train
        try:
            passes, counts = self._minibatches(batch, prox, ref, adv_tok, sample_w, include,
                                               live, mb_size, old)
        except FloatingPointError:
            if saved is not None:
                self.model.load_state_dict(saved[0])
                self.opt.load_state_dict(saved[1])
            self.opt.zero_grad(set_to_none=True)
            raise
        metrics.update(passes)
        self.sched.step()  # the warm-up counts RL steps, not mini-batches
        metrics["lr"] = self.sched.get_last_lr()[0]
        self.version += 1
        if self.prox_ema is not None:
            self.prox_ema.update(self.model)
        metrics.update(version_lag_metrics(batch, self.version - 1))
        metrics["adv/mean"] = float(adv.mean())
        metrics["adv/abs_mean"] = float(adv.abs().mean())
        metrics["train/tokens"] = batch.n_tokens
        metrics["train/skipped_share"] = 1.0 - float(live.float().mean())
        metrics.update(counts.metrics())  # padding share, positions forwarded, entropy
        metrics.update(tree_m)
        return metrics

    def _snapshot(self) -> tuple[dict, dict]:
        return ({k: v.detach().clone() for k, v in self.model.state_dict().items()},
                copy.deepcopy(self.opt.state_dict()))

    def _live(self, adv_tok: torch.Tensor, mask: torch.Tensor,
              sample_w: torch.Tensor) -> torch.Tensor:
        """[N] bool: the samples whose loss can have a gradient. Without ``skip_inert`` or
        under an objective where A = 0 is not inert (`Objective.zero_advantage_inert`),
        every sample; otherwise those with a trainable token, a nonzero advantage on one,
        and a nonzero sample weight."""
        if not (self.options.skip_inert and self.objective.zero_advantage_inert):
            return torch.ones(len(mask), dtype=torch.bool)
        signal = ((adv_tok != 0) & (mask > 0)).any(-1) & (sample_w != 0)  # [N]
        return signal.cpu()

    def _minibatches(self, batch, prox, ref, adv_tok, sample_w, include, live, mb_size, old
                     ) -> tuple[dict[str, float], PassCounts]:
        """Every mini-batch's passes and optimiser step: (their metrics, combined as
        `reroll.trainer.reductions` declares; what the passes counted). ``old``: per-version
        old log-probs that replace pi_prox where computed, or None."""
        n = len(batch)
        order = torch.arange(n)
        mbs = micro_slices(n, mb_size)
        lengths = batch.attention_mask.sum(-1).tolist()  # [N] tokens of each sequence
        prompts = _prompts(batch)
        # the samples each mini-batch passes through the model; at least one (one with a
        # trainable token where there is one), so that an update whose samples are all inert
        # still makes its zero-gradient optimiser step with the same parameters holding
        # gradients as a full pass would (true of dense models: see TrainConfig)
        tokens = (batch.mask.sum(-1) > 0).cpu()  # [N]
        runs = [order[mb][live[mb]] if live[mb].any()
                else order[mb][tokens[mb].int().argmax()].view(1) for mb in mbs]
        combined = UpdateMetrics(minibatches=len(mbs), samples=sum(len(r) for r in runs))
        counts = PassCounts()
        for mb, run in zip(mbs, runs):
            # global normalisers of this mini-batch (excluded samples, e.g. pivots, not counted)
            n_tok = max(float(batch.mask[mb].sum()), 1.0)
            n_seq = max(float(include[mb].sum()), 1.0)
            self.optimiser_step.begin()
            for sel in self._plan(lengths, run, prompts):
                size = [lengths[i] for i in sel.tolist()]  # padded to the longest, or packed
                sel = sel.to(self.device)
                sub = batch.slice(sel).trim()
                packed = self._packing(sub, size)
                pos, real = shared_prompt.packed_positions(*packed) if packed is not None \
                    else (len(size) * max(size), sum(size))
                counts.positions += float(pos)
                counts.real_tokens += float(real)
                t = sub.targets.shape[1]  # this micro-batch's positions [b, t]
                logp, ent = self._forward(self.model, sub, entropy=True,
                                          packing=packed)  # [b, t], [b, t]
                counts.entropy_sum += float((ent * sub.mask).sum())
                counts.entropy_tokens += sub.n_tokens
                prox_mb = logp.detach() if prox is None else prox[sel, :t]  # [b, t]
                if old is not None:  # pi_train,v: the staleness factor's denominator
                    prox_mb = torch.where(old[1][sel, :t], old[0][sel, :t], prox_mb)
                inp = LossInputs(logprobs=logp, prox_logprobs=prox_mb,
                                 behav_logprobs=sub.behav_logprobs, advantages=adv_tok[sel, :t],
                                 mask=sub.mask, n_tokens=n_tok, n_seqs=n_seq,
                                 ref_logprobs=None if ref is None else ref[sel, :t],
                                 sample_weights=sample_w[sel])
                self.optimiser_step.observe(inp)
                loss, m = self.objective.loss(inp)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"non-finite loss {float(loss.detach())} at trainer version {self.version}; "
                        f"weights and optimiser left at the last good update")
                loss.backward()
                combined.add_all(m, samples=len(sel))
            combined.add_all(self.optimiser_step(self.version))
        return combined.values, counts

    # ---- the rest of TrainerHandle ------------------------------------------------------
    def weights(self, trained_only: bool = False, adapters: bool = False) -> dict[str, Any]:
        """A copy of the current weights (no later in-place update reaches it) in
        ``publish_dtype`` (bf16 training publishes bf16: the engine's dtype), on the trainer's
        device (the engine copies them onto its own). A LoRA policy's are merged
        (`reroll.lora.engine_state_dict`), or with ``adapters`` in adapter form
        (`reroll.lora.adapter_state_dict`); ``trained_only``: what training changes alone."""
        from reroll import lora

        dt, m = self.publish_dtype, self.model
        if lora.is_lora(m) and not adapters:
            return lora.engine_state_dict(m, dt, copy=True, adapted_only=trained_only)
        return lora.adapter_state_dict(m, dt, adapter_only=trained_only)  # a plain model: all

    def save_checkpoint(self, run_dir: Path, step: int, state: dict[str, Any],
                        groups: Sequence[Group], extras: dict[str, Any] | None = None) -> Path:
        """Model, optimiser, LR schedule and RNG, plus the caller's ``state`` and unconsumed
        ``groups`` (and ``extras``, see `checkpoint.save`; the PPO-EWMA weights where they
        are kept), written atomically by `checkpoint.save`."""
        if self.tokenizer is None:
            raise ValueError("Trainer.save_checkpoint needs the tokenizer (Trainer(tokenizer=))")
        extras = dict(extras or {})
        if self.prox_ema is not None:
            extras[EMA_FILE] = self.prox_ema.state()
        if self.snapshots is not None:
            extras[SNAPSHOT_FILE] = self.snapshots.state()
        return checkpoint.save(run_dir, step, self.model, self.tokenizer, self.opt, state,
                               list(groups), lr_scheduler=self.sched, extras=extras)

    def resume(self, ckpt: Path) -> None:
        """Continue from checkpoint ``ckpt`` (its model weights already loaded): optimiser,
        schedule, random state, version, the PPO-EWMA weights and the version snapshots
        where they are kept."""
        checkpoint.load_trainer_state(ckpt, self.opt, self.sched)
        self.version = checkpoint.read_state(ckpt).get("version", 0)
        if self.prox_ema is not None:
            self.prox_ema.load(checkpoint.read_extra(ckpt, EMA_FILE))
        if self.snapshots is not None:
            self.snapshots.load(checkpoint.read_extra(ckpt, SNAPSHOT_FILE))

    def policy(self) -> torch.nn.Module:
        return self.model

    def close(self) -> None:
        pass


def _prompts(batch: Batch) -> tuple[list[int], list[int]] | None:
    """Each sample's prompt id (`collate`) and prompt length, or None."""
    if batch.prompt_ids is None:
        return None
    return batch.prompt_ids.tolist(), batch.prompt_lens.tolist()
