"""Supervised warm start on task demonstrations: prompt + demo + EOS, loss on the demo and
EOS tokens only, so that a tiny model starts RL with a non-zero success rate.

A multi-turn demonstration is a list of ``(role, text)`` turns after the prompt, exactly as
the multi-turn workflow produces them: "policy" turns are tokenized as the text the policy
would sample (loss on them), "env" turns as the workflow appends observations (no loss);
EOS (with loss) follows the last policy turn.

Training runs on the model's device (batches are collated on the CPU and copied there) and
in the model's own dtype, the master weights (and AdamW's state); ``autocast_dtype``
(bf16) runs forward and backward under autocast, as the RL `Trainer` does
(`reroll.trainer.precision`). `reroll sft` loads float32 master weights and saves the
result in `model.dtype`.

Checkpoints (``save``, every ``ckpt_every`` steps, at the last step and when ``stop`` is
requested by a signal) hold what the next step depends on: weights, AdamW's state, the lr
schedule's position, the random generators and the batch sampler's state; a run continued
from one (``resume``) takes the same steps as the uninterrupted run, bit for bit. The
checkpoint layout is `reroll.trainer.checkpoint`'s; this module only hands it the pieces.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from reroll.rollout import Example, Rollout
from reroll.stopping import Stopped
from reroll.trainer.batch import collate, token_logprobs
from reroll.trainer.micro_batches import plan_micro_batches
from reroll.trainer.precision import autocast
from reroll.trainer.schedules import lr_factor


def demo_rollout(ex: Example, encode, eos_id: int, tok, turns=None,
                 encode_observation=None) -> Rollout:
    if turns is not None:
        return turns_rollout(ex, encode, eos_id, tok, turns, encode_observation)
    if ex.demo is None:
        raise ValueError(f"example {ex.prompt_id} has no demonstration; SFT needs task demos")
    p = encode(ex.prompt)
    d = tok(ex.demo, add_special_tokens=False).input_ids + [eos_id]
    r = Rollout(prompt_id=ex.prompt_id, group_id="sft", tokens=p + d, prompt_len=len(p))
    r.loss_mask = [False] * len(p) + [True] * len(d)
    return r


def turns_rollout(ex: Example, encode, eos_id: int, tok, turns, encode_observation) -> Rollout:
    """Prompt, then each turn's tokens (policy: loss; env: none), then EOS (loss)."""
    tokens = list(encode(ex.prompt))
    mask = [False] * len(tokens)
    for role, text in turns:
        if role not in ("policy", "env"):
            raise ValueError(f"example {ex.prompt_id}: demo turn role must be policy or env, "
                             f"got {role!r}")
        ids = (tok(text, add_special_tokens=False).input_ids if role == "policy"
               else encode_observation(text))
        tokens += ids
        mask += [role == "policy"] * len(ids)
    r = Rollout(prompt_id=ex.prompt_id, group_id="sft", tokens=tokens + [eos_id],
                prompt_len=len(encode(ex.prompt)))
    r.loss_mask = mask + [True]
    return r


def adamw(params, *, lr: float, weight_decay: float = 0.0, fused: bool = True):
    """AdamW as RL and SFT both build it. ``fused`` (`train.fused_optimizer`): torch's fused
    kernel, one call for every parameter, as transformers' default optimiser
    (adamw_torch_fused); otherwise torch's default implementation (a loop over parameters
    on the CPU, foreach kernels on CUDA). The same update up to float rounding."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999),
                             **({"fused": True} if fused else {}))


def sft(model, tok, examples: list[Example], encode, *, steps: int, lr: float, batch_size: int,
        seed: int = 0, schedule: str = "constant", warmup_steps: int = 20,
        log=None, demos=None, encode_observation=None,
        autocast_dtype: torch.dtype | None = None, logprob_chunk: int = 0,
        fused_optimizer: bool = True, ckpt_every: int = 0, save=None, resume: Path | None = None,
        stop=None, micro_tokens: int = 0) -> list[float]:
    """Train in place; returns the loss per step (mean negative log-likelihood per token).

    The default schedule is constant after warm-up, so accuracy grows with `steps` instead of
    depending on where a decay to zero happens to end (a tiny model's accuracy jumps sharply
    while it learns carrying, and a decaying schedule freezes it mid-jump). ``demos(example)
    -> [(role, text), ...]`` gives multi-turn demonstrations (see the module docstring).
    ``autocast_dtype``: bf16 autocast over the model's own (float32) weights, None: none;
    ``logprob_chunk``: tokens of logits made at a time (`train.logprob_chunk`);
    ``fused_optimizer``: `adamw`'s ``fused`` (`train.fused_optimizer`);
    ``micro_tokens`` (`sft.micro_batch_tokens`): 0 forwards the whole batch at once, padded to its
    longest demo; > 0 forwards it in micro-batches of at most that many padded positions,
    longest demos together (`plan_micro_batches`), and accumulates their gradients. The loss
    is the same sum over the batch's demo tokens divided by their count, so the step is the
    same up to float rounding, with far less padding where demo lengths vary.

    ``save(step, optimizer, lr_scheduler, extras)`` writes a checkpoint after ``step`` (every
    ``ckpt_every`` steps, at the last, and when ``stop``, a `reroll.stopping.StopFlag`, is
    requested: then `Stopped` is raised after it). ``resume``: the checkpoint to continue
    from (the model already holds its weights); only the steps after it run and are
    returned."""
    rows = [demo_rollout(ex, encode, tok.eos_token_id, tok,
                         demos(ex) if demos is not None else None, encode_observation)
            for ex in examples]
    rng = random.Random(seed)
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]  # a LoRA policy: its adapters
    opt = adamw(params, lr=lr, fused=fused_optimizer)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(
        s, steps=steps, warmup_steps=warmup_steps, schedule=schedule))
    start = _restore(resume, opt, sched, rng) if resume is not None else 0
    model.train()
    losses = []
    for step in range(start, steps):
        picked = rng.sample(rows, min(batch_size, len(rows)))
        opt.zero_grad(set_to_none=True)
        loss = _accumulate(model, picked, tok.pad_token_id, device, micro_tokens,
                           autocast_dtype, logprob_chunk)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        losses.append(loss)
        if log is not None:
            log(step + 1, {"sft/loss": losses[-1]})
        stopping = stop is not None and stop.requested
        if save is not None and (stopping or step + 1 == steps
                                 or (ckpt_every > 0 and (step + 1) % ckpt_every == 0)):
            save(step + 1, opt, sched, {SAMPLER: rng.getstate()})
        if stopping:
            raise Stopped(step + 1, stop.signum)
    model.eval()
    return losses


def _accumulate(model, picked: list[Rollout], pad_id: int, device, micro_tokens: int,
                autocast_dtype, logprob_chunk: int) -> float:
    """Backward of the batch's loss (summed NLL of its demo tokens over their count), in
    micro-batches when ``micro_tokens`` > 0; the loss's value."""
    plan = (plan_micro_batches([len(r.tokens) for r in picked], len(picked), micro_tokens)
            if micro_tokens > 0 else [list(range(len(picked)))])
    count = sum(sum(r.loss_mask[1:]) for r in picked)  # the tokens predicted with loss
    total = 0.0
    for part in plan:
        batch = collate([picked[i] for i in part], pad_id).to(device)
        with autocast(device, autocast_dtype):
            logp = token_logprobs(model, batch, chunk=logprob_chunk)  # [b, L-1], float32
        loss = -(logp * batch.mask).sum() / count
        loss.backward()
        total += loss.detach().item()
    return total


SAMPLER = "sft_sampler.pt"  # the batch sampler's state, in an SFT checkpoint


def _restore(ckpt: Path, opt, sched, rng: random.Random) -> int:
    """Optimiser, schedule, random generators and sampler from ``ckpt``; its step."""
    from reroll.trainer import checkpoint

    state, _ = checkpoint.load_state(ckpt, opt, sched)
    rng.setstate(checkpoint.read_extra(ckpt, SAMPLER))
    return state["step"]


def save_model(model, tok, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
