"""What padding costs the update when response lengths have a long tail, and what cutting
micro-batches by length saves (`train.micro_batch`, `train.micro_batch_tokens`).

One batch of ``--groups`` x 8 samples with the long-tail response lengths of
`engine_throughput.py` (85% uniform 8-48 tokens, 10% uniform 49-255, 5% exactly 256; 3-5
token prompts), rewards 0/1 at random with both in every group (GRPO advantages, none 0,
so nothing is skipped), PPO clip, token-mean, AdamW, on a random-init Qwen2 (``--hidden``,
``--layers``). Contestants, each in a fresh process (so its peak RSS is its own),
alternated ``--repeats`` times:

  hand_global   a hand-written loop padding the whole batch to its longest sequence and
                slicing ``--micro`` rows at a time (what TRL's GRPOTrainer does)
  hand_local    the same loop collating each slice of ``--micro`` rows on its own (padded to
                that slice's longest)
  reroll        reroll's `Trainer.step`, ``micro_batch = --micro`` (in order, each
                micro-batch padded to its own longest)
  reroll_tokens reroll's `Trainer.step`, ``micro_batch_tokens = --tokens`` (sorted by length,
                at most that many padded positions a pass)

Prints per contestant the median update time over ``--steps`` updates (the first left out),
the padded positions forwarded per update, the peak RSS, and the time ratio against
hand_global. The updates are the same up to float rounding (tests/trainer/test_micro_batches.py).

    python benchmarks/micro_batches.py --repeats 2
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONTESTANTS = ("hand_global", "hand_local", "reroll", "reroll_tokens")
CLIP = 0.2


def lengths(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        u = rng.random()
        out.append(rng.randint(8, 48) if u < 0.85 else rng.randint(49, 255) if u < 0.95 else 256)
    return out


def groups_for(n_groups: int, vocab: int, seed: int):
    """Scored groups of 8 (reroll's records): long-tail responses, rewards 0/1."""
    from reroll.rollout import Example, SamplingParams, Score, new_group

    rng = random.Random(seed)
    resp = lengths(n_groups * 8, seed)
    out = []
    for g_i in range(n_groups):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(3, 5))]
        g = new_group(Example(f"p{g_i}", "", ""), 8, prompt, SamplingParams(), 0)
        for j, r in enumerate(g.rollouts):
            for _ in range(resp[g_i * 8 + j]):
                r.append(rng.randrange(3, vocab), -2.0, 0)
            rew = float(j == 0 or (j > 1 and rng.random() < 0.5))  # mixed: none skipped
            r.finish, r.scores, r.reward = "length", [Score("exact", value=rew)], rew
        out.append(g)
    return out


def hand_step(model, opt, groups, micro: int, local: bool) -> int:
    """One update by a hand-written loop; returns the padded positions it forwarded."""
    import torch

    rs = [r for g in groups for r in g.rollouts]
    rew = torch.tensor([r.reward for r in rs]).view(len(groups), -1)
    adv = ((rew - rew.mean(-1, keepdim=True)) / (rew.std(-1, keepdim=True) + 1e-6)).view(-1)
    n_tok = sum(r.response_len for r in rs)

    def pad(part, width):
        ids = torch.tensor([r.tokens + [0] * (width - len(r.tokens)) for r in part])
        att = torch.tensor([[1] * len(r.tokens) + [0] * (width - len(r.tokens)) for r in part])
        mask = torch.tensor([[0] * r.prompt_len + [1] * r.response_len
                             + [0] * (width - len(r.tokens)) for r in part], dtype=torch.float32)
        return ids, att, mask[:, 1:]

    width = max(len(r.tokens) for r in rs)
    positions = 0
    opt.zero_grad(set_to_none=True)
    for s in range(0, len(rs), micro):
        part = rs[s:s + micro]
        ids, att, mask = pad(part, max(len(r.tokens) for r in part) if local else width)
        positions += ids.numel()
        logits = model(input_ids=ids, attention_mask=att).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        a = adv[s:s + micro, None]
        surr = torch.minimum(ratio * a, ratio.clamp(1 - CLIP, 1 + CLIP) * a)
        (-(surr * mask).sum() / n_tok).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return positions


def contestant(name: str, model_dir: str, a) -> dict:
    """Runs in its own process: ``--steps`` updates on the same batch."""
    import torch

    from reroll.algo import build_objective
    from reroll.config import AlgoConfig
    from reroll.models import load
    from reroll.trainer.options import TrainerOptions
    from reroll.trainer.step import Trainer

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model, tok = load(model_dir)
    model.eval()
    groups = groups_for(a.groups, len(tok), a.seed)
    times, positions = [], 0
    if name.startswith("hand"):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
        for _ in range(a.steps):
            t0 = time.perf_counter()
            positions = hand_step(model, opt, groups, a.micro, local=name == "hand_local")
            times.append(time.perf_counter() - t0)
    else:
        tokens = a.tokens if name == "reroll_tokens" else 0
        tr = Trainer(model, build_objective(AlgoConfig()),
                     TrainerOptions(pad_id=tok.pad_token_id, lr=1e-5,
                                    micro_batch=a.micro if not tokens else 10**9,
                                    micro_batch_tokens=tokens))
        for _ in range(a.steps):
            t0 = time.perf_counter()
            m = tr.step(groups)
            times.append(time.perf_counter() - t0)
        real = sum(len(r.tokens) for g in groups for r in g.rollouts)
        positions = round(real / (1.0 - m["train/padding_share"]))  # the loss passes'

    real = sum(len(r.tokens) for g in groups for r in g.rollouts)
    return {"s": statistics.median(times[1:]), "positions": positions, "real": real,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default=",".join(CONTESTANTS))
    ap.add_argument("--run", default=None, help=argparse.SUPPRESS)  # child: NAME=MODEL_DIR
    a = ap.parse_args()
    if a.run:
        name, model_dir = a.run.split("=", 1)
        print(json.dumps(contestant(name, model_dir, a)))
        return
    from reroll.config import ModelConfig
    from reroll.models import build_tiny

    model_dir = build_tiny(ModelConfig(hidden_size=a.hidden, num_layers=a.layers,
                                       intermediate_size=2 * a.hidden, max_position=320),
                           Path(tempfile.mkdtemp(prefix="reroll-mb-")), seed=0)
    names = a.only.split(",")
    res: dict[str, list[dict]] = {n: [] for n in names}
    args = [f"--{k}={v}" for k, v in (("groups", a.groups), ("micro", a.micro),
                                       ("tokens", a.tokens), ("steps", a.steps),
                                       ("threads", a.threads), ("seed", a.seed))]
    for rep in range(a.repeats):
        for n in (names if rep % 2 == 0 else names[::-1]):
            out = subprocess.run([sys.executable, __file__, f"--run={n}={model_dir}", *args],
                                 check=True, capture_output=True, text=True).stdout
            res[n].append(json.loads(out.strip().splitlines()[-1]))
            print(n, res[n][-1], flush=True)
    real = res[names[0]][0]["real"]  # the same batch in every contestant
    base = statistics.median(r["s"] for r in res[names[0]])
    print(f"\n{a.groups * 8} samples, {real} tokens; hidden {a.hidden}, {a.layers} layers, "
          f"micro {a.micro}, budget {a.tokens}, {a.threads} thread(s)")
    print(f"{'contestant':14} {'s/update':>9} {'positions':>9} {'padding':>8} {'peak RSS':>9} "
          f"{'vs ' + names[0]:>16}")
    for n in names:
        s = statistics.median(r["s"] for r in res[n])
        pos = res[n][0]["positions"]
        rss = max(r["rss_mib"] for r in res[n])
        print(f"{n:14} {s:9.3f} {pos:9d} {1 - real / pos:8.1%} {rss:7.0f} MiB {base / s:15.2f}x")


if __name__ == "__main__":
    main()
