"""Tree rollouts (``rollout.workflow = "tree"``) against independent samples: generated tokens
per step, held-out greedy accuracy, sampled pass@1 and pass@k after training.

Workload: the main job (``configs/arithmetic.toml``) from its SFT checkpoint, ``--steps``
GRPO steps of 16 groups, synchronous; ``reroll eval`` of the final checkpoint on the 500
held-out prompts (greedy accuracy, sampled pass@1 and pass@8).
Methods change only ``[rollout]``:

- ``indep8``: 8 independent samples per prompt (the main job);
- ``tree8_w2``: 8 leaves as 4 trees of 2, forking after the first response token;
- ``tree8_w4``: 8 leaves as 2 trees of 4, forking after the first response token;
- ``indep6``: 6 independent samples, about the generated tokens of ``tree8_w4``
  (equal-token baseline);
- ``tree8_w2_seg``, ``tree8_w4_seg``: the two trees with TreeRL's segment credit
  (``rollout.tree_credit = "segments"``, 1/sqrt(leaves) scale): each token trained once, in
  the member that sampled it, with its node's advantage and loss weight the number of
  leaves that hold it (the gradient of training every root-to-leaf path);
- ``tree8_w2_once``, ``tree8_w4_once``: the same in reroll's variant
  (``rollout.tree_credit = "segments_once"``): every token's weight 1.
- ``latr8_w2``, ``latr8_w4``: ``rollout.tree_branch = "entropy"`` (LATR's rule at its
  defaults: tau_abs 0.15, tau_rel 0.25, the member takes the most likely token and the
  branch the second, lookahead pruning at 20, 30, 50 tokens): 4 trees of 2 / 2 trees of 4
  members, each a root and spares that branch off wherever a member's two most likely
  tokens are close; spares the rule did not use are sampled independently (``branched`` is
  the share of members the rule spawned, ``tree/branched_share`` averaged over steps).

Generated tokens are ``pipeline/tokens_generated`` (what the engine sampled; inherited
tokens are not sampled again); trained tokens are ``train/tokens`` (tokens in the loss:
leaf credit trains inherited tokens once per leaf, segment credit once). Runs go one after
another through ``reroll train``.

    .venv/bin/python benchmarks/tree.py [--steps 200] [--seeds 0 1] [--init runs/bench_replay/sft]
        [--methods indep8 tree8_w4 ...]
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REROLL = str(Path(sys.executable).with_name("reroll"))
CONFIG = str(ROOT / "configs" / "arithmetic.toml")
METHODS: dict[str, list[str]] = {
    "indep8": [],
    "tree8_w2": ["rollout.workflow=tree", "rollout.tree_branch_at=[1]", "rollout.tree_width=2"],
    "tree8_w4": ["rollout.workflow=tree", "rollout.tree_branch_at=[1]", "rollout.tree_width=4"],
    "indep6": ["rollout.group_size=6"],
    "tree8_w2_seg": ["rollout.workflow=tree", "rollout.tree_branch_at=[1]", "rollout.tree_width=2",
                     "rollout.tree_credit=segments"],
    "tree8_w4_seg": ["rollout.workflow=tree", "rollout.tree_branch_at=[1]", "rollout.tree_width=4",
                     "rollout.tree_credit=segments"],
    "tree8_w2_once": ["rollout.workflow=tree", "rollout.tree_branch_at=[1]", "rollout.tree_width=2",
                      "rollout.tree_credit=segments_once"],
    "tree8_w4_once": ["rollout.workflow=tree", "rollout.tree_branch_at=[1]", "rollout.tree_width=4",
                      "rollout.tree_credit=segments_once"],
    "latr8_w2": ["rollout.workflow=tree", "rollout.tree_branch=entropy", "rollout.tree_width=2"],
    "latr8_w4": ["rollout.workflow=tree", "rollout.tree_branch=entropy", "rollout.tree_width=4"],
}


def run_one(out: Path, name: str, seed: int, init: str, steps: int) -> dict:
    run = out / "runs" / f"{name}_seed{seed}"
    shutil.rmtree(run, ignore_errors=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    args = [REROLL, "train", CONFIG, f"out_dir={run}", f"init={init}", f"train.steps={steps}",
            f"train.seed={seed}", "log_every=1", "record_every=0", f"eval.every={steps}",
            f"ckpt_every={steps}", *METHODS[name], "--no-progress"]
    t0 = time.perf_counter()
    with run.with_name(run.name + ".log").open("w") as f:
        p = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"command failed: {' '.join(args)}")
    wall = time.perf_counter() - t0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]
    last = {r["step"]: r for r in rows}[steps]
    got = run / "eval.json"  # sampled pass@1 and pass@8 of the final checkpoint
    with run.with_name(run.name + ".eval.log").open("w") as f:
        p = subprocess.run([REROLL, "eval", CONFIG, "--checkpoint", str(run), "--output",
                            str(got)], stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"reroll eval failed on {run}")
    ev = {k: v for k, v in json.loads(got.read_text()).items() if k.startswith("eval/")}
    return {"method": name, "seed": seed, "wall_s": wall,
            "tokens_per_step": last["pipeline/tokens_generated"] / steps,
            "trained_per_step": statistics.mean(r["train/tokens"] for r in rows
                                                if "train/tokens" in r),
            "reward_mean": statistics.mean(r["reward/mean"] for r in rows if "reward/mean" in r),
            "branched": statistics.mean(r.get("tree/branched_share", 0.0) for r in rows),
            **ev}


def summarise(results: list[dict]) -> str:
    keys = ["tokens_per_step", "trained_per_step", "branched", "reward_mean",
            "eval/greedy_accuracy", "eval/pass@1_sampled", "eval/pass@8"]
    lines = ["| method | " + " | ".join(keys) + " | wall s |", "|---" * (len(keys) + 2) + "|"]
    for name in METHODS:
        rs = [r for r in results if r["method"] == name]
        if not rs:
            continue
        cells = [", ".join(f"{r.get(k, float('nan')):.3f}" if not k.endswith("_per_step")
                           else f"{r[k]:.0f}" for r in rs) for k in keys]
        wall = statistics.mean(r["wall_s"] for r in rs)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {wall:.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--out", default="runs/bench_tree")
    ap.add_argument("--init", default="runs/bench_replay/sft",
                    help="an SFT checkpoint of the main job (reroll sft configs/arithmetic.toml)")
    a = ap.parse_args()
    out = ROOT / a.out
    results = []
    for seed in a.seeds:
        for name in a.methods:
            results.append(run_one(out, name, seed, a.init, a.steps))
            r = results[-1]
            print(f"{name} seed {seed}: {r['tokens_per_step']:.0f} tokens/step, greedy "
                  f"{r.get('eval/greedy_accuracy', float('nan')):.3f}, wall {r['wall_s']:.0f} s",
                  flush=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\n{platform.processor() or platform.machine()}, seeds {a.seeds}, {a.steps} steps\n"
          f"{summarise(results)}")


if __name__ == "__main__":
    main()
