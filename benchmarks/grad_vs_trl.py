"""One GRPO update, computed by reroll's `Trainer.step` and by TRL's `GRPOTrainer` loss, on
the same batch from the same weights: do the two compute the same update?

The batch: ``--prompts`` training prompts of the config's task, ``group_size`` samples each
from reroll's own engine (temperature 1, up to ``--max-new`` tokens, seeded), rewarded by the
task's verifier. The behaviour log-probs are set to the trainer's own (so reroll's
``tis_token`` weight pi_prox / mu is 1, as TRL has no such weight without vLLM).

reroll side: the real `Trainer` that `reroll.build.build_trainer` builds from the config
(its objective, micro-batches, share_prompt packing, skipping of zero-advantage samples),
one `Trainer.step` on the groups.

TRL side: a `GRPOTrainer` built with `vs_trl.run_trl`'s arguments (loss_type "dapo",
scale_rewards "group", beta 0, epsilon 0.2, num_iterations 1, lr constant, wd 0, grad clip 1);
its inputs laid out as its `_generate_and_score_completions` does (prompts left-padded,
completions right-padded, the mask up to and including the first EOS, ``num_items_in_batch``
the mask's sum), its advantages by that function's formula (group mean, `trl.trainer.utils.
nanstd` with Bessel's correction, ``+ 1e-4``), then its own `_compute_loss`, backward,
`clip_grad_norm_` (what transformers' Trainer calls with ``max_grad_norm``) and one step of
the optimiser its `create_optimizer` builds.

Prints the per-sample advantages of both, the loss, the gradient's norm, cosine and norm
ratio, the clipped gradient, the weights after the step, and the masks. Owns laying one
batch out both ways and comparing the two updates (tests/test_grad_vs_trl.py pins them on a
tiny model); must not know the tournament or any training loop.

    python benchmarks/grad_vs_trl.py --init /work/runs5/c/sft --max-new 256
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "reasoning.toml"


def sample_groups(cfg, model, tok, task, prompts: int, max_new: int, seed: int):
    """``prompts`` training examples (drawn with ``seed``), ``cfg.rollout.group_size`` samples
    each from reroll's engine at the config's temperature, scored by the task's verifier
    (a failed verifier raises: never a silent 0)."""
    from reroll import build_rollout
    from reroll.rollout import SamplingParams
    from reroll.trainer.evaluate import _run, plan

    examples = random.Random(seed).sample(task.train, prompts)
    scorer = build_rollout.build_scorer(cfg, task)
    params = SamplingParams(temperature=cfg.rollout.temperature, max_new_tokens=max_new,
                            stop_token_ids=[tok.eos_token_id])
    torch.manual_seed(seed)
    groups = asyncio.run(_run(model, plan(cfg, tok), examples, scorer,
                              build_rollout.encode_prompt(tok), params,
                              cfg.rollout.group_size, None))
    for g in groups:
        for r in g.rollouts:
            if r.reward is None:
                raise RuntimeError(f"verifier failed on a sample of {g.example.prompt!r}: "
                                   + "; ".join(s.error for s in r.scores if not s.ok))
    return groups


def own_behaviour(model, groups, pad_id: int) -> None:
    """Set every sampled token's behaviour log-prob to ``model``'s own (float32, unpacked)."""
    from reroll.trainer.batch import collate, flatten, token_logprobs

    rollouts = flatten(groups)[0]
    with torch.no_grad():
        lp = token_logprobs(model.eval(), collate(rollouts, pad_id))  # [N, L-1]
    for i, r in enumerate(rollouts):
        r.logprobs = [0.0] + [float(x) for x in lp[i, :len(r.tokens) - 1]]


def _flat_grad(params) -> torch.Tensor:
    return torch.cat([p.grad.detach().flatten() for p in params])


def reroll_update(trainer, groups) -> dict:
    """One `Trainer.step`; the loss (the micro-batch losses summed), the advantages, the
    gradient before and after the clip and the weights after the step."""
    from reroll.trainer.batch import flatten

    class Spy:  # records every micro-batch's loss and the clip's input
        def __init__(self, objective):
            self.objective, self.total = objective, 0.0

        def __getattr__(self, k):
            return getattr(self.objective, k)

        def loss(self, inp):
            loss, m = self.objective.loss(inp)
            self.total += float(loss.detach())
            return loss, m

    spy = Spy(trainer.objective)
    trainer.objective = spy
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    before = torch.cat([p.detach().flatten() for p in params]).clone()
    raw = {}
    clip = torch.nn.utils.clip_grad_norm_

    def capture(ps, *a, **kw):  # the gradient as the optimiser step sees it, before clipping
        raw["g"] = _flat_grad(params).clone()
        return clip(ps, *a, **kw)

    torch.nn.utils.clip_grad_norm_ = capture
    try:
        m = trainer.step(groups)
    finally:
        torch.nn.utils.clip_grad_norm_, trainer.objective = clip, spy.objective
    rewards, comps, gidx = flatten(groups)[1:]
    adv, _ = trainer.objective.advantages(rewards, comps, gidx, torch.ones(len(rewards)))
    return {"loss": spy.total, "adv": adv, "grad": raw["g"], "clipped": _flat_grad(params),
            "grad_norm": m["grad_norm"], "skipped": m["train/skipped_share"], "before": before,
            "weights": torch.cat([p.detach().flatten() for p in params])}


def trl_inputs(groups, pad_id: int, eos_ids: list[int]) -> dict:
    """TRL's batch for the groups' samples, as `_generate_and_score_completions` lays it out:
    prompt ids left-padded with their mask, completion ids (the tokens after the prompt)
    right-padded, their mask 1 up to and including the first EOS (TRL's rule after
    `generate`), and ``num_items_in_batch`` the mask's sum."""
    from trl.trainer.utils import pad

    rollouts = [r for g in groups for r in g.rollouts]
    prompts = [torch.tensor(r.tokens[:r.prompt_len]) for r in rollouts]
    comps = [torch.tensor(r.tokens[r.prompt_len:]) for r in rollouts]
    p_ids = pad(prompts, padding_value=pad_id, padding_side="left")
    p_mask = pad([torch.ones_like(x) for x in prompts], padding_value=0, padding_side="left")
    c_ids = pad(comps, padding_value=pad_id, padding_side="right")
    is_eos = torch.isin(c_ids, torch.tensor(eos_ids)) & \
        pad([torch.ones_like(x, dtype=torch.bool) for x in comps], padding_value=False)
    eos_idx = torch.full((len(comps),), c_ids.shape[1], dtype=torch.long)
    eos_idx[is_eos.any(1)] = is_eos.int().argmax(1)[is_eos.any(1)]
    c_mask = (torch.arange(c_ids.shape[1])[None] <= eos_idx[:, None]).long()
    c_mask = c_mask * pad([torch.ones_like(x) for x in comps], padding_value=0)
    return {"prompt_ids": p_ids, "prompt_mask": p_mask, "completion_ids": c_ids,
            "completion_mask": c_mask, "num_items_in_batch": c_mask.sum()}


def trl_advantages(rewards: torch.Tensor, k: int) -> torch.Tensor:
    """TRL 1.16's `_generate_and_score_completions` (trl/trainer/grpo_trainer.py lines
    2765-2787, scale_rewards "group"): (R - group nanmean) / (group nanstd + 1e-4), nanstd
    with Bessel's correction (trl/trainer/utils.py `nanstd`)."""
    from trl.trainer.utils import nanstd

    mean = torch.nanmean(rewards.view(-1, k), dim=1).repeat_interleave(k)
    std = nanstd(rewards.view(-1, k), dim=1).repeat_interleave(k)
    return torch.nan_to_num((rewards - mean) / (std + 1e-4), nan=0.0)


def build_trl(model_dir: Path, tok, *, k: int, groups: int, max_new: int, lr: float,
              clip: float, grad_clip: float = 1.0):
    """A GRPOTrainer with `vs_trl.run_trl`'s arguments (its dataset and reward unused here);
    ``grad_clip``: its max_grad_norm (run_trl's is 1.0)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl-"), per_device_train_batch_size=k * groups,
        num_generations=k, max_completion_length=max_new, temperature=1.0,
        learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=grad_clip, beta=0.0, epsilon=clip, loss_type="dapo", scale_rewards="group",
        num_iterations=1, max_steps=1, use_cpu=True, bf16=False, fp16=False,
        gradient_checkpointing=False, use_vllm=False, report_to="none", save_strategy="no",
        disable_tqdm=True, seed=0, dataloader_num_workers=0)
    ds = Dataset.from_list([{"prompt": "x"}] * (k * groups))
    return GRPOTrainer(model=str(model_dir), reward_funcs=lambda completions, **_: [0.0] *
                       len(completions), args=args, train_dataset=ds, processing_class=tok)


def trl_update(trainer, groups, pad_id: int) -> dict:
    """TRL's loss, gradient, clip and optimiser step on the groups' samples."""
    k = len(groups[0].rollouts)
    rewards = torch.tensor([r.reward for g in groups for r in g.rollouts], dtype=torch.float32)
    inputs = trl_inputs(groups, pad_id, trainer.eos_token_ids)
    inputs["advantages"] = trl_advantages(rewards, k)
    model = trainer.model
    model.train()  # as in Trainer.training_step (the tiny Qwen2 has no dropout)
    trainer.current_gradient_accumulation_steps = 1  # set per step by Trainer's loop
    params = [p for p in model.parameters() if p.requires_grad]
    before = torch.cat([p.detach().flatten() for p in params]).clone()
    opt = trainer.create_optimizer()
    opt.zero_grad(set_to_none=True)
    loss = trainer._compute_loss(model, inputs)
    loss.backward()
    raw = _flat_grad(params).clone()
    gn = torch.nn.utils.clip_grad_norm_(params, trainer.args.max_grad_norm)
    clipped = _flat_grad(params)
    opt.step()
    return {"loss": float(loss.detach()), "adv": inputs["advantages"], "grad": raw,
            "clipped": clipped, "grad_norm": float(gn), "inputs": inputs, "opt": opt, "before": before,
            "weights": torch.cat([p.detach().flatten() for p in params])}


def compare(a: dict, b: dict) -> dict:
    """Differences between two updates' advantages, loss, gradients and weights after."""
    def cos(x, y):
        return float(torch.nn.functional.cosine_similarity(x.double(), y.double(), dim=0))

    da, db = a["weights"] - a["before"], b["weights"] - b["before"]  # the steps taken

    return {"adv_max_abs_diff": float((a["adv"] - b["adv"]).abs().max()),
            "loss": (a["loss"], b["loss"]),
            "grad_norm": (a["grad_norm"], b["grad_norm"]),
            "grad_cos": cos(a["grad"], b["grad"]),
            "grad_norm_ratio": float(a["grad"].norm() / b["grad"].norm()),
            "grad_max_abs_diff": float((a["grad"] - b["grad"]).abs().max()),
            "clipped_cos": cos(a["clipped"], b["clipped"]),
            "clipped_max_abs_diff": float((a["clipped"] - b["clipped"]).abs().max()),
            "start_max_abs_diff": float((a["before"] - b["before"]).abs().max()),
            "step_cos": cos(da, db),
            "step_norm_ratio": float(da.norm() / db.norm()),
            "weights_max_abs_diff": float((a["weights"] - b["weights"]).abs().max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, default=CONFIG)
    ap.add_argument("--init", type=Path, required=True, help="the SFT run directory")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--trl-eps", action="store_true",
                    help="reroll's advantages with TRL's 1e-4 in the std's denominator (its "
                         "default is 1e-6): what is left is float rounding")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from reroll import build
    from reroll.config_checks import load_checked

    cfg = load_checked(str(a.config), [f"init={a.init}", f"rollout.max_new_tokens={a.max_new}"]
                       + (["algo.advantage_args.eps=1e-4"] if a.trl_eps else []))
    model_dir = build.weights_dir(a.init)
    trainer = build.build_trainer(cfg, model_dir)
    tok, task = trainer.tokenizer, build.build_task(cfg)
    groups = sample_groups(cfg, trainer.model, tok, task, a.prompts, a.max_new, a.seed)
    rs = [r for g in groups for r in g.rollouts]
    engine_lp = [list(r.logprobs) for r in rs]
    own_behaviour(trainer.model, groups, tok.pad_token_id)
    gap = torch.tensor([e - o for r, lp in zip(rs, engine_lp)
                        for e, o, m in zip(lp, r.logprobs, r.loss_mask) if m])
    print(f"engine's log-probs of its samples less the trainer's: mean {float(gap.mean()):.2e},"
          f" max |.| {float(gap.abs().max()):.2e} over {len(gap)} tokens")
    n_new = [len(r.tokens) - r.prompt_len for r in rs]
    print(f"{len(rs)} samples, rewards {[r.reward for r in rs]}")
    print(f"completion tokens: mean {sum(n_new) / len(n_new):.1f}, max {max(n_new)}, "
          f"ended by EOS {sum(r.tokens[-1] == tok.eos_token_id for r in rs)}")
    # the reward through the baselines' path: TRL's text (batch_decode, skip_special_tokens)
    # scored by benchmarks/baseline_inputs.reward_fn
    from baseline_inputs import reward_fn

    score = reward_fn(tok, task, a.config)
    texts = tok.batch_decode([r.tokens[r.prompt_len:] for r in rs], skip_special_tokens=True)
    same = [score(g.example.prompt, texts[i * len(g.rollouts) + j]) == r.reward
            for i, g in enumerate(groups) for j, r in enumerate(g.rollouts)]
    print(f"TRL's reward path gives reroll's reward on {sum(same)} of {len(same)} samples")
    t = build_trl(model_dir, tok, k=cfg.rollout.group_size, groups=a.prompts,
                  max_new=a.max_new, lr=cfg.train.lr, clip=0.2, grad_clip=cfg.train.grad_clip)
    gc = t.generation_config
    print(f"TRL generation: do_sample {gc.do_sample} temperature {gc.temperature} top_k "
          f"{gc.top_k} top_p {gc.top_p} min_p {gc.min_p} repetition_penalty "
          f"{gc.repetition_penalty}; eos {t.eos_token_ids}")
    x = trl_update(t, groups, tok.pad_token_id)
    from reroll.trainer.batch import collate

    batch = collate(rs, tok.pad_token_id)
    inp = x["inputs"]
    same_mask = all(batch.mask[i, r.prompt_len - 1:r.prompt_len - 1 + int(inp["completion_mask"][i].sum())]
                    .bool().all() and int(batch.mask[i].sum()) == int(inp["completion_mask"][i].sum())
                    for i, r in enumerate(rs))
    print(f"trainable tokens: reroll {int(batch.mask.sum())}, TRL {int(inp['num_items_in_batch'])};"
          f" the same positions in every sample: {same_mask}")
    for name, opt in (("reroll", trainer.opt), ("TRL", x["opt"])):
        print(f"optimiser {name}: {type(opt).__name__}, groups " + "; ".join(
            f"{len(g['params'])} tensors lr {g['lr']} betas {g['betas']} eps {g['eps']} "
            f"wd {g['weight_decay']} fused {g['fused']}" for g in opt.param_groups))
    r = reroll_update(trainer, groups)
    print(f"reroll skipped share {r['skipped']:.3f}")
    print("advantages reroll:", [round(float(v), 4) for v in r["adv"]])
    print("advantages TRL:   ", [round(float(v), 4) for v in x["adv"]])
    for key, v in compare(r, x).items():
        print(f"{key:22s} {v}")


if __name__ == "__main__":
    main()
