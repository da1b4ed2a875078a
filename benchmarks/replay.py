"""The Replay stage against fresh-only GRPO: freshly generated rollout tokens and training
time to a target held-out accuracy, with rollout replay (DOTS+RR) and with AR3PO response
reuse, 3 seeds.

Workload and measurement are those of ``benchmarks/control.py`` (whose helpers this script
imports): the mixed-difficulty task (``configs/mixed.toml``), one shared SFT warm start, the
same samples trained per step (16 groups x 8), lr 1e-4, held-out greedy accuracy on all 300
held-out prompts every ``--eval-every`` steps, curves smoothed over 3 evaluations. The
baseline row is called ``fixed`` (fresh rollouts only, as in control.py). A method changes
only its ``[replay]`` keys:

- ``buffer``: ``replay.buffer_size = 256``, ``fresh_fraction = 0.5``: each step generates 8
  groups and draws 8 informative groups of earlier steps from the buffer.
- ``reuse``: ``replay.reuse = true``: a group with no correct answer gets its prompt's last
  banked correct answer in place of its last member.
- ``buffer+reuse``: both.

The x axis is ``pipeline/tokens_generated``: response tokens the engine generated
(replayed or reused samples cost none). The target is ``--target-frac`` x fixed's final
accuracy (mean over seeds). Runs go one after another through ``reroll train``.

    .venv/bin/python benchmarks/replay.py [--quick] [--seeds 0 1 2] [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import control as c  # noqa: E402  (the shared workload and runner)
import control_report as cr  # noqa: E402  (parsing, summaries, tables, plots)

METHODS: dict[str, list[str]] = {
    "fixed": [],
    "buffer": ["replay.buffer_size=256", "replay.fresh_fraction=0.5"],
    "reuse": ["replay.reuse=true"],
    "buffer+reuse": ["replay.buffer_size=256", "replay.fresh_fraction=0.5", "replay.reuse=true"],
}
BASE = ["log_every=1", "record_every=0", "train.lr=1e-4"]


def run_one(out: Path, name: str, seed: int, overrides: list[str], init: Path, steps: int,
            every: int, extra: list[str], fresh: bool) -> tuple[Path, bool]:
    run = out / "runs" / f"{name.replace('+', '_')}_seed{seed}"
    args = [c.CONFIG, f"out_dir={run}", f"init={init}", f"train.steps={steps}",
            f"eval.every={every}", f"ckpt_every={steps}", f"train.seed={seed}", *BASE, *extra,
            *overrides]
    spec = run / "bench_args.json"
    rows = cr.read_rows(run)
    if (not fresh and spec.is_file() and json.loads(spec.read_text()) == args
            and rows and rows[-1]["step"] == steps):
        return run, True
    shutil.rmtree(run, ignore_errors=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    c.sh([c.REROLL, "train", *args, "--no-progress"], run.with_name(run.name + ".log"))
    spec.write_text(json.dumps(args))
    return run, False


def replay_diag(run: Path) -> dict:
    rows = [r for r in cr.read_rows(run) if r["step"] > 0]
    last = rows[-1]
    return {"replayed_share": statistics.fmean(r.get("replay/samples_in_batch", 0.0)
                                               / r["pipeline/samples_in_batch"] for r in rows),
            "injected": last.get("replay/injected", 0.0),
            "replayed_groups": last.get("replay/replayed_groups", 0.0),
            "buffer_groups": last.get("replay/buffer_groups", 0.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=None)
    ap.add_argument("--steps", type=int, default=None, help="RL steps per run (500)")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--out", default="/tmp/reroll_bench_control",
                    help="work directory (shares benchmarks/control.py's SFT warm start)")
    ap.add_argument("--target-frac", type=float, default=0.95)
    ap.add_argument("--smooth", type=int, default=3)
    ap.add_argument("--plots", default=str(c.ROOT / "benchmarks" / "plots"))
    ap.add_argument("--fresh", action="store_true", help="rerun cached RL runs")
    ap.add_argument("--quick", action="store_true", help="smoke test: 30 steps, 1 seed")
    args = ap.parse_args()
    seeds = args.seeds or ([0] if args.quick else [0, 1, 2])
    steps = args.steps or (30 if args.quick else 500)
    out = Path(args.out) / ("quick" if args.quick else "")
    extra = ["eval.n_examples=60"] if args.quick else []
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=c.ROOT,
                            capture_output=True, text=True).stdout.strip()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load "
          f"{os.getloadavg()[0]:.2f}; commit {commit}; {c.CONFIG}, {steps} steps, eval every "
          f"{args.eval_every}, seeds {seeds}; overrides {BASE + extra}", flush=True)
    init = c.warm_start(out, ["sft.steps=100"] if args.quick else [])
    runs: dict[str, list[dict]] = {}
    diags: dict[str, list[dict]] = {}
    for seed in seeds:
        for name, ov in METHODS.items():
            t1 = time.perf_counter()
            run, cached = run_one(out, name, seed, ov, init, steps, args.eval_every, extra,
                                  args.fresh)
            r = cr.parse(run)
            runs.setdefault(name, []).append(r)
            diags.setdefault(name, []).append(replay_diag(run))
            p = r["points"]
            print(f"  {name} seed {seed}: acc {p[0]['acc']:.3f} -> {cr.final(p):.3f}, "
                  f"{p[-1]['tokens'] / 1e3:.0f}k fresh tokens, {p[-1]['train_s']:.0f} s "
                  f"[{'cached' if cached else f'{time.perf_counter() - t1:.0f} s'}]", flush=True)

    base_final = statistics.fmean(cr.final(r["points"]) for r in runs["fixed"])
    target = args.target_frac * base_final
    t_eq = min(r["points"][-1]["tokens"] for rs in runs.values() for r in rs)
    summary = cr.summarise(runs, target, args.smooth, t_eq)
    print(f"\ntarget {target:.3f} ({args.target_frac} x fresh-only final {base_final:.3f}); "
          f"start {summary['fixed']['start_acc']:.3f}; equal tokens {t_eq / 1e3:.0f}k; "
          f"fixed = fresh rollouts only; tokens = freshly generated, in thousands\n")
    print(cr.table(summary, target, t_eq))
    print("\n| method | replayed or reused share of trained samples | groups replayed | "
          "answers injected | buffer at end |\n|---|---|---|---|---|")
    for name, ds in diags.items():
        m = {k: statistics.fmean(d[k] for d in ds) for k in ds[0]}
        print(f"| {name} | {m['replayed_share']:.0%} | {m['replayed_groups']:.0f} | "
              f"{m['injected']:.0f} | {m['buffer_groups']:.0f} |")
    cands = {n: m for n, m in summary.items() if n != "fixed"}
    best = max(cands, key=lambda n: cands[n]["ratio_tokens"] or 0.0)
    print(f"\nfewest fresh tokens to {target:.3f}: {best}, fixed / method "
          f"{cr.ratio(cands[best]['ratio_tokens'])} (seed-mean curve "
          f"{cr.ratio(cands[best]['ratio_tokens_mean_curve'])})")
    if not args.quick:
        plots = Path(args.plots)
        how = {"title": "reroll Replay stage vs fresh-only GRPO (same SFT start, 128 trained "
                        "samples a step)", "labels": {"fixed": "fresh only (GRPO)"}}
        cr.plot(summary, "tokens", target, plots / "replay_tokens.png",
               "freshly generated response tokens (thousands)", **how)
        cr.plot(summary, "train_s", target, plots / "replay_time.png", "training seconds", **how)
        (out / "replay_results.json").write_text(json.dumps(
            {"target": target, "summary": {k: {kk: vv for kk, vv in v.items()
                                               if kk != "mean_curve"}
                                           for k, v in summary.items()}}, default=str))


if __name__ == "__main__":
    main()
