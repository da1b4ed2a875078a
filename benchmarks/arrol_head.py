"""How well a trained ARRoL head tells a group's members apart, and what its cuts do.

From a run's last checkpoint (policy and quality head: ``arrol_head.pt``), ``--prompts``
train prompts of arith_mixed (configs/mixed.toml) get ``--size`` fresh samples each
(temperature 1, seeded), generated to the end and scored. The head predicts every sample at
its checkpoint position (``k = min(at, L - 1)``, from the trainer's `prefix_hidden`, the
features the engine uses). Printed: the head's within-group AUC (P(p of a correct member >
p of a wrong one), groups with both outcomes) per difficulty level, and the share of groups
with both outcomes among the ``--keep`` members kept by the pruning rule, by a seeded
random cut, and among all ``--size`` (what any cut of them can reach at most).

    .venv/bin/python benchmarks/arrol_head.py RUN_DIR [--prompts 400] [--size 12] [--keep 8]
"""

from __future__ import annotations

import argparse
import random
import statistics
from pathlib import Path

import torch

from reroll import build, build_rollout
from reroll.config_checks import load_checked
from reroll.engine import TorchEngine
from reroll.engine.quality import QualityHead, survivors
from reroll.methods.arrol_head import HEAD_FILE, prefix_hidden
from reroll.rollout import Rollout, SamplingParams
from reroll.trainer import checkpoint
from reroll.verifiers import VERIFIERS


def auc(ps: list[float], ys: list[bool]) -> float | None:
    pos = [p for p, y in zip(ps, ys) if y]
    neg = [p for p, y in zip(ps, ys) if not y]
    if not pos or not neg:
        return None
    return sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path)
    ap.add_argument("--prompts", type=int, default=400)
    ap.add_argument("--size", type=int, default=12)
    ap.add_argument("--keep", type=int, default=8)
    args = ap.parse_args()
    torch.set_num_threads(1)
    ck = checkpoint.latest(args.run)
    cfg = load_checked(args.run / "config.toml", [])
    at = (cfg.control.pruner_args.get("at") or max(1, cfg.rollout.max_new_tokens // 4))
    model, tok = build.load_model(ck / "model", cfg, dtype="float32")
    saved = checkpoint.read_extra(ck, HEAD_FILE)["head"]
    width = model.get_output_embeddings().in_features
    first = saved["net.weight"] if "net.weight" in saved else saved["net.0.weight"]
    head = QualityHead(width, at, hidden=0 if "net.weight" in saved else first.shape[0],
                       confidence=first.shape[1] == width + 3)
    head.load_state_dict(saved)
    task = build.build_task(cfg)
    encode, rng = build_rollout.encode_prompt(tok), random.Random(0)
    exs = rng.sample(task.train, args.prompts)
    rs = [Rollout(prompt_id=ex.prompt_id, group_id=str(g), tokens=encode(ex.prompt),
                  prompt_len=len(encode(ex.prompt)), index_in_group=i,
                  sampling=SamplingParams(temperature=1.0, seed=1000 * g + i,
                                          max_new_tokens=cfg.rollout.max_new_tokens,
                                          stop_token_ids=[tok.eos_token_id]))
          for g, ex in enumerate(exs) for i in range(args.size)]
    TorchEngine(model.eval(), tok, max_batch=min(len(rs), 512)).generate(rs)
    verifier = VERIFIERS.get("numeric")()
    ok = [verifier(r, exs[int(r.group_id)]).value >= 1.0 for r in rs]
    h, k, lp = prefix_hidden(model, rs, at, tok.pad_token_id, torch.device("cpu"))
    p = head.predict(h, k, lp).tolist()
    aucs: dict[str, list[float]] = {}
    mixed: dict[str, list[bool]] = {"rule": [], "random": [], "all": []}
    for g, ex in enumerate(exs):
        idx = range(g * args.size, (g + 1) * args.size)
        a = auc([p[j] for j in idx], [ok[j] for j in idx])
        if a is not None:
            aucs.setdefault(ex.fields.get("difficulty", "?"), []).append(a)
        preds = {i: p[j] for i, j in enumerate(idx)}
        fin = [i for i, j in enumerate(idx) if rs[j].response_len <= at]
        live = [i for i in range(args.size) if i not in fin]
        cut = {"rule": survivors(preds, fin, args.keep), "all": list(range(args.size)),
               "random": fin + rng.sample(live, max(0, min(len(live), args.keep - len(fin))))}
        for name, keep in cut.items():
            ys = [ok[idx[i]] for i in keep]
            mixed[name].append(0 < sum(ys) < len(ys))
    print(f"{args.run} ({ck.name}): at {at}, head features "
          f"{'hidden + position + log-probs' if head.confidence else 'hidden + position'}; "
          f"{args.prompts} prompts x {args.size} samples, success {statistics.fmean(ok):.3f}")
    print("  within-group AUC: " + ", ".join(
        f"{lv} {statistics.fmean(v):.3f} ({len(v)} groups)" for lv, v in sorted(aucs.items())))
    print(f"  groups with both outcomes: rule keeps {args.keep} {statistics.fmean(mixed['rule']):.3f}"
          f", random {args.keep} {statistics.fmean(mixed['random']):.3f}, all {args.size} "
          f"{statistics.fmean(mixed['all']):.3f}")


if __name__ == "__main__":
    main()
