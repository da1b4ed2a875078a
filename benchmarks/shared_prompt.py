"""What forwarding each prompt once saves (`train.share_prompt`): the update on synthetic
groups at several prompt/response lengths, and the main job end to end.

``--part update``: one batch of ``--groups`` groups x 8 samples with a prompt of P tokens and
responses of R tokens (uniform in [R/2, R]), GRPO advantages (both rewards in every group),
PPO clip, token-mean, AdamW, on a random-init Qwen2 (``--hidden``, ``--layers``), one micro-
batch. For each (P, R) of ``--shapes``: a hand-written loop (the padded batch, one forward and
backward), reroll's `Trainer.step` with the padded batch, and with ``share_prompt`` (which
packs only where that costs fewer FLOPs, `shared_prompt.pays`); median seconds per update
over ``--steps`` updates, alternated ``--repeats`` times; the positions each forwards.

``--part budget``: the same update under a token budget (``train.micro_batch_tokens`` =
``--budget``), ``--budget-groups`` groups at ``--budget-shape``: padded micro-batches; packed
by prompt with the samples sorted one by one (the plan before prompts were kept together);
each prompt's samples kept together with the budget counted in padded positions (the plan
before it counted the layout's); and kept together with the budget counted in the positions
of the layout each pass runs in (`plan_micro_batches`' ``units``, `PackedCost`).

``--part main``: ``reroll train configs/arithmetic.toml`` from one SFT warm start (``--init``
or built once), ``--main-steps`` synchronous steps with and without the option, alternated;
median update time (``time/train_s``), whole step, held-out greedy accuracy at the end.

    python benchmarks/shared_prompt.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CLIP = 0.2


def groups_for(n_groups: int, prompt: int, resp: int, vocab: int, seed: int):
    from reroll.rollout import Example, SamplingParams, Score, new_group

    rng = random.Random(seed)
    out = []
    for g_i in range(n_groups):
        ptoks = [rng.randrange(3, vocab) for _ in range(prompt)]
        g = new_group(Example(f"p{g_i}", "", ""), 8, ptoks, SamplingParams(), 0)
        for j, r in enumerate(g.rollouts):
            for _ in range(rng.randint(max(1, resp // 2), resp)):
                r.append(rng.randrange(3, vocab), -2.0, 0)
            rew = float(j == 0 or (j > 1 and rng.random() < 0.5))
            r.finish, r.scores, r.reward = "length", [Score("exact", value=rew)], rew
        out.append(g)
    return out


def hand_step(model, opt, groups) -> int:
    """The padded batch through one forward and backward: what a hand loop does."""
    import torch

    rs = [r for g in groups for r in g.rollouts]
    rew = torch.tensor([r.reward for r in rs]).view(len(groups), -1)
    adv = ((rew - rew.mean(-1, keepdim=True)) / (rew.std(-1, keepdim=True) + 1e-6)).view(-1)
    w = max(len(r.tokens) for r in rs)
    ids = torch.tensor([r.tokens + [0] * (w - len(r.tokens)) for r in rs])
    att = torch.tensor([[1] * len(r.tokens) + [0] * (w - len(r.tokens)) for r in rs])
    mask = torch.tensor([[0] * r.prompt_len + [1] * r.response_len + [0] * (w - len(r.tokens))
                         for r in rs], dtype=torch.float32)[:, 1:]
    opt.zero_grad(set_to_none=True)
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    ratio = torch.exp(logp - logp.detach())
    surr = torch.minimum(ratio * adv[:, None], ratio.clamp(1 - CLIP, 1 + CLIP) * adv[:, None])
    (-(surr * mask).sum() / mask.sum()).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return ids.numel()


def part_update(a) -> None:
    import torch

    from reroll.algo import build_objective
    from reroll.config import AlgoConfig, ModelConfig
    from reroll.models import build_tiny, load
    from reroll.trainer.options import TrainerOptions
    from reroll.trainer.step import Trainer

    torch.set_num_threads(a.threads)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    model_dir = build_tiny(ModelConfig(hidden_size=a.hidden, num_layers=a.layers,
                                       intermediate_size=2 * a.hidden,
                                       max_position=max(p + r for p, r in shapes) + 8),
                           Path(tempfile.mkdtemp(prefix="reroll-sp-")), seed=0)
    model, tok = load(model_dir)
    model.eval()
    print(f"{a.groups} groups x 8, hidden {a.hidden}, {a.layers} layers, {a.threads} thread(s)")
    print(f"{'prompt x resp':>14} {'hand s':>8} {'reroll s':>9} {'shared s':>9} "
          f"{'positions hand/shared':>22} {'shared vs hand':>15} {'vs reroll':>10}")
    for p, r in shapes:
        groups = groups_for(a.groups, p, r, len(tok), a.seed)
        times: dict[str, list[float]] = {"hand": [], "reroll": [], "shared": []}
        positions = {}
        for rep in range(a.repeats):
            for name in (["hand", "reroll", "shared"] if rep % 2 == 0
                         else ["shared", "reroll", "hand"]):
                torch.manual_seed(0)
                if name == "hand":
                    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.0)
                    step = partial(hand_step, model, opt, groups)
                else:
                    tr = Trainer(model, build_objective(AlgoConfig()),
                                 TrainerOptions(pad_id=tok.pad_token_id, lr=1e-6, micro_batch=10**6,
                                                share_prompt=name == "shared"))
                    step = partial(tr.step, groups)
                out = step()  # warm-up
                for _ in range(a.steps):
                    t0 = time.perf_counter()
                    out = step()
                    times[name].append(time.perf_counter() - t0)
                positions[name] = out if name == "hand" else round(out["train/positions"])
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{p:>6} x {r:<5} {med['hand']:8.3f} {med['reroll']:9.3f} {med['shared']:9.3f} "
              f"{positions['hand']:>10} / {positions['shared']:<9} "
              f"{med['hand'] / med['shared']:14.2f}x {med['reroll'] / med['shared']:9.2f}x",
              flush=True)


def part_budget(a) -> None:
    import torch

    from reroll.algo import build_objective
    from reroll.config import AlgoConfig, ModelConfig
    from reroll.models import build_tiny, load
    from reroll.trainer.micro_batches import plan_micro_batches
    from reroll.trainer.options import TrainerOptions
    from reroll.trainer.step import Trainer

    class BySample(Trainer):  # the plan before units: samples sorted one by one
        def _plan(self, lengths, run, prompts):
            return super()._plan(lengths, run, None)

    class PaddedBudget(Trainer):  # prompts kept together, the budget in padded positions
        def _plan(self, lengths, run, prompts):
            idx = run.tolist()
            return [run[torch.tensor(p, dtype=torch.long)] for p in plan_micro_batches(
                [lengths[i] for i in idx], self.options.micro_batch,
                self.options.micro_batch_tokens,
                [prompts[0][i] for i in idx])]

    torch.set_num_threads(a.threads)
    p, r = (int(x) for x in a.budget_shape.split("x"))
    model_dir = build_tiny(ModelConfig(hidden_size=a.hidden, num_layers=a.layers,
                                       intermediate_size=2 * a.hidden, max_position=p + r + 8),
                           Path(tempfile.mkdtemp(prefix="reroll-spb-")), seed=0)
    model, tok = load(model_dir)
    model.eval()
    groups = groups_for(a.budget_groups, p, r, len(tok), a.seed)
    kinds = {"padded": (Trainer, False), "shared, by sample": (BySample, True),
             "by prompt, padded budget": (PaddedBudget, True),
             "shared, by prompt": (Trainer, True)}
    times: dict[str, list[float]] = {k: [] for k in kinds}
    out = {}
    for rep in range(a.repeats):
        for name in (list(kinds) if rep % 2 == 0 else list(kinds)[::-1]):
            cls, share = kinds[name]
            torch.manual_seed(0)
            tr = cls(model, build_objective(AlgoConfig()),
                     TrainerOptions(pad_id=tok.pad_token_id, lr=1e-6, micro_batch=10**6,
                                    micro_batch_tokens=a.budget, share_prompt=share))
            passes = []
            real = tr._forward
            tr._forward = lambda m, b, entropy=False, real=real, passes=passes, **kw: \
                passes.append(1) or real(m, b, entropy, **kw)
            tr.step(groups)  # warm-up
            for _ in range(a.steps):
                passes.clear()
                t0 = time.perf_counter()
                out[name] = tr.step(groups)
                times[name].append(time.perf_counter() - t0)
            out[name]["passes"] = len(passes)
    print(f"{a.budget_groups} groups x 8, prompt {p}, responses {r // 2}-{r} tokens, budget "
          f"{a.budget} positions, hidden {a.hidden}, {a.layers} layers")
    base = statistics.median(times["padded"])
    for name in kinds:
        med = statistics.median(times[name])
        print(f"{name:>18}: {med:7.3f} s/update  x{base / med:4.2f}  passes {out[name]['passes']:>3}"
              f"  positions {round(out[name]['train/positions']):>6}", flush=True)


def part_main(a) -> None:
    out = Path(tempfile.mkdtemp(prefix="reroll-spm-"))
    config = REPO / "configs" / "arithmetic.toml"
    init = a.init
    if init is None:
        init = out / "sft"
        subprocess.run([sys.executable, "-m", "reroll.cli", "sft", str(config),
                        f"out_dir={init}"], check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    res: dict[bool, list[dict]] = {False: [], True: []}
    for rep in range(a.repeats):
        for share in ((False, True) if rep % 2 == 0 else (True, False)):
            run = out / f"run-{share}-{rep}"
            subprocess.run([sys.executable, "-m", "reroll.cli", "train", str(config),
                            f"out_dir={run}", f"init={init}", f"train.steps={a.main_steps}",
                            f"eval.every={a.main_steps}", "log_every=1",
                            f"ckpt_every={a.main_steps}", "record_every=0",
                            f"train.share_prompt={str(share).lower()}"],
                           check=True, cwd=REPO, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
            rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            steps = [r for r in rows[1:] if "time/train_s" in r]
            walls = [b["time"] - x["time"] - b.get("time/eval_s", 0.0)
                     for x, b in zip(rows[1:], rows[2:])]
            res[share].append({
                "train_s": statistics.median(r["time/train_s"] for r in steps[10:]),
                "step_s": statistics.median(walls[10:]),
                "padding": statistics.fmean(r["train/padding_share"] for r in steps),
                "accuracy": [r["eval/greedy_accuracy"] for r in rows
                             if "eval/greedy_accuracy" in r][-1]})
            print("share" if share else "plain", res[share][-1], flush=True)
    m = {k: {f: statistics.fmean(x[f] for x in v) for f in v[0]} for k, v in res.items()}
    print(f"\nmain job, {a.main_steps} steps x {a.repeats}: update {m[False]['train_s']:.4f} -> "
          f"{m[True]['train_s']:.4f} s (x{m[False]['train_s'] / m[True]['train_s']:.2f}), "
          f"step {m[False]['step_s']:.4f} -> {m[True]['step_s']:.4f} s "
          f"(x{m[False]['step_s'] / m[True]['step_s']:.2f}); padding share "
          f"{m[False]['padding']:.3f} -> {m[True]['padding']:.3f}; held-out "
          f"{m[False]['accuracy']:.3f} / {m[True]['accuracy']:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", default="update,main")
    ap.add_argument("--shapes", default="256x32,64x64,16x256")
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--budget-shape", default="256x128")
    ap.add_argument("--budget-groups", type=int, default=8)
    ap.add_argument("--main-steps", type=int, default=150)
    ap.add_argument("--init", type=Path, default=None, help="an SFT checkpoint of the main job")
    a = ap.parse_args()
    if "update" in a.part:
        part_update(a)
    if "budget" in a.part:
        part_budget(a)
    if "main" in a.part:
        part_main(a)


if __name__ == "__main__":
    main()
