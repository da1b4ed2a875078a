"""VCPO against plain decoupled PPO on stale rollouts: held-out accuracy and stability at
``runtime.max_staleness`` 4 and 8, 3 seeds, on the main job (``configs/arithmetic.toml``)
from its SFT checkpoint; and what VCPO costs per step.

Methods, each from the same SFT checkpoint with the main job's settings (16 groups x 8,
lr 1e-4, GRPO advantages, PPO clip 0.2, token_mean, tis_token cap 2); only ``[algo]`` keys
differ:

- ``ppo``: plain decoupled PPO (the defaults). It logs the sequence ESS too, through
  ``algo.ess_lr`` with ``ess_base_ratio = 1e-9``: min(1, rho / 1e-9) = 1, so its factor is
  exactly 1 and its updates are the plain ones (tested bitwise in tests/trainer/test_vcpo_trainer.py).
- ``ess_lr``: + VCPO's ESS-scaled learning rate (sqrt rule, base ratio 1).
- ``vcpo``: + the off-policy optimal baseline too (``algo.advantage = "opob"``, per group,
  / group std), so the surrogate, aggregation and correction stay ``ppo``'s.

Stability: a run *collapses* when the trailing 25-step mean of its training reward falls
below half of its first 25 steps' mean; also reported: the largest drop of held-out accuracy
below its running best (points), and the sequence-ESS ratio over time (mean, minimum, share
of steps under 0.5). Cost: ``--cost-steps`` synchronous steps of each method, the methods
taking turns ``--cost-repeats`` times: median train seconds per step (the best repeat) and
the per-sample gradient passes' seconds.

    nice -n 10 .venv/bin/python benchmarks/vcpo.py [--quick] [--seeds 0 1 2]
        [--staleness 4 8] [--steps 600] [--eval-every 50] [--out runs/bench_vcpo]

Finished runs are reused on a rerun with the same arguments (the script can be stopped and
started again). Results: OUT/results.md, OUT/results.json, OUT/vcpo.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from control import sh  # noqa: E402  (one runner for every benchmark)

ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/arithmetic.toml"
REROLL = str(Path(sys.executable).parent / "reroll")
BASE = ["log_every=1", "record_every=0"]
METHODS: dict[str, list[str]] = {
    "ppo": ["algo.ess_lr=true", "algo.ess_base_ratio=1e-9"],
    "ess_lr": ["algo.ess_lr=true"],
    "vcpo": ["algo.ess_lr=true", "algo.advantage=opob"],
}
COLLAPSE_WINDOW = 25


def read_rows(run: Path) -> list[dict]:
    p = run / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def warm_start(out: Path) -> Path:
    """The main job's SFT checkpoint (``out/sft``), made once."""
    sft = out / "sft"
    if not (sft / "model" / "config.json").is_file():
        shutil.rmtree(sft, ignore_errors=True)
        out.mkdir(parents=True, exist_ok=True)
        s = sh([REROLL, "sft", CONFIG, f"out_dir={sft}"], out / "sft.log")
        print(f"SFT warm start: {s:.0f} s -> {sft}", flush=True)
    return sft


def run_one(out: Path, tag: str, args: list[str], launcher: list[str] = (),
            config: str = CONFIG) -> Path:
    """``reroll train CONFIG`` with ``args`` into out/runs/TAG, unless a finished run with the
    same arguments is already there; ``launcher``: the command that runs ``reroll`` (default:
    the venv's ``reroll`` itself)."""
    run = out / "runs" / tag
    spec = run / "bench_args.json"
    rows = read_rows(run)
    steps = int(next(a for a in args if a.startswith("train.steps=")).split("=")[1])
    if spec.is_file() and json.loads(spec.read_text()) == args and rows \
            and rows[-1]["step"] == steps:
        return run
    shutil.rmtree(run, ignore_errors=True)
    run.parent.mkdir(parents=True, exist_ok=True)
    s = sh([*(launcher or [REROLL]), "train", config, f"out_dir={run}", *args, "--no-progress"],
           run.with_name(tag + ".log"))
    spec.write_text(json.dumps(args))
    print(f"  {tag}: {s:.0f} s", flush=True)
    return run


# ---- summaries ----------------------------------------------------------------------------

def trailing(y: list[float], w: int) -> list[float]:
    return [statistics.fmean(y[max(0, i - w + 1): i + 1]) for i in range(len(y))]


def parse(run: Path) -> dict:
    rows = read_rows(run)
    steps = [r for r in rows if r["step"] > 0]
    evals = [(r["step"], r["eval/greedy_accuracy"]) for r in rows if "eval/greedy_accuracy" in r]
    reward = [r["reward/mean"] for r in steps]
    ess = [r.get("vcpo/ess_ratio", math.nan) for r in steps]
    start = statistics.fmean(reward[:COLLAPSE_WINDOW])
    tr = trailing(reward, COLLAPSE_WINDOW)
    collapsed = next((steps[i]["step"] for i in range(COLLAPSE_WINDOW, len(tr))
                      if tr[i] < 0.5 * start), None)
    best, drop = -1.0, 0.0
    for _, a in evals:
        best = max(best, a)
        drop = max(drop, best - a)
    accs = [a for _, a in evals]
    return {
        "steps": [r["step"] for r in steps], "reward": reward, "ess": ess, "evals": evals,
        "final_acc": statistics.fmean(accs[-2:]) if accs else math.nan,
        "best_acc": max(accs) if accs else math.nan, "start_acc": accs[0] if accs else math.nan,
        "collapsed_at": collapsed, "max_drop": drop,
        "ess_mean": statistics.fmean(ess), "ess_min": min(ess),
        "ess_low_share": sum(e < 0.5 for e in ess) / len(ess),
        "lr_scale_mean": statistics.fmean(r.get("vcpo/lr_scale", 1.0) for r in steps),
        "lag_mean": statistics.fmean(r.get("staleness/mean_lag", 0.0) for r in steps),
        "lag_max": max(r.get("staleness/max_lag", 0.0) for r in steps),
        "train_s_median": statistics.median(r["time/train_s"] for r in steps),
        "step_s_median": statistics.median(r["time/step_s"] for r in steps),
        "reward_last50": statistics.fmean(reward[-50:]),
    }


def mean_sd(v: list[float], f: str = ".3f") -> str:
    """Mean +- sample std over seeds (NaNs left out), formatted with ``f``."""
    v = [x for x in v if not math.isnan(x)]
    if not v:
        return "-"
    sd = statistics.stdev(v) if len(v) > 1 else 0.0
    return f"{statistics.fmean(v):{f}} +- {sd:{f}}"


def table(summary: dict) -> str:
    head = ("| max_staleness | method | held-out acc, final (mean of last 2 evals) | best | "
            "collapses | worst drop from best | seq-ESS ratio mean / min / share < 0.5 | "
            "lr factor mean | mean lag | train s/step |\n|" + "---|" * 10)
    lines = [head]
    for k, methods in summary.items():
        for name, rs in methods.items():
            col = sum(r["collapsed_at"] is not None for r in rs)
            lines.append(
                f"| {k} | {name} | {mean_sd([r['final_acc'] for r in rs])} | "
                f"{mean_sd([r['best_acc'] for r in rs])} | {col} of {len(rs)} | "
                f"{mean_sd([r['max_drop'] for r in rs])} | "
                f"{statistics.fmean(r['ess_mean'] for r in rs):.3f} / "
                f"{min(r['ess_min'] for r in rs):.3f} / "
                f"{statistics.fmean(r['ess_low_share'] for r in rs):.3f} | "
                f"{statistics.fmean(r['lr_scale_mean'] for r in rs):.3f} | "
                f"{statistics.fmean(r['lag_mean'] for r in rs):.2f} | "
                f"{statistics.fmean(r['train_s_median'] for r in rs):.3f} |")
    return "\n".join(lines)


STYLE = {"ppo": "black", "ess_lr": "tab:blue", "vcpo": "tab:red"}


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = list(summary)
    fig, axes = plt.subplots(len(ks), 3, figsize=(15, 4 * len(ks)), squeeze=False)
    for row, k in zip(axes, ks):
        for name, rs in summary[k].items():
            c = STYLE.get(name, None)
            for j, r in enumerate(rs):
                lab = name if j == 0 else None
                row[0].plot(*zip(*r["evals"]), color=c, alpha=0.7, label=lab)
                row[1].plot(r["steps"], trailing(r["reward"], COLLAPSE_WINDOW), color=c,
                            alpha=0.7, label=lab)
                row[2].plot(r["steps"], trailing(r["ess"], 10), color=c, alpha=0.7, label=lab)
        row[0].set_title(f"max_staleness {k}: held-out greedy accuracy")
        row[1].set_title(f"training reward (trailing {COLLAPSE_WINDOW}-step mean)")
        row[2].set_title("sequence ESS / B (trailing 10-step mean)")
        for ax in row:
            ax.set_xlabel("step")
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=70)


def cost(out: Path, sft: Path, steps: int, repeats: int) -> dict:
    """Synchronous steps of each method, the methods taking turns ``repeats`` times: the
    median train seconds per step of each run, the smallest over its repeats (other jobs on
    the box only ever add time)."""
    res: dict[str, dict] = {}
    for i in range(repeats):
        for name, over in METHODS.items():
            run = run_one(out, f"cost_{name}_r{i}", [f"init={sft}", f"train.steps={steps}",
                                                     "eval.every=0", f"ckpt_every={steps}",
                                                     *BASE, *over])
            rows = [r for r in read_rows(run) if r["step"] > 2]  # past warm-up
            m = {"train_s": statistics.median(r["time/train_s"] for r in rows),
                 "step_s": statistics.median(r["time/step_s"] for r in rows),
                 "grad_norm_passes_s": statistics.median(
                     r.get("time/vcpo_grad_norms_s", 0.0) for r in rows)}
            if name not in res or m["train_s"] < res[name]["train_s"]:
                res[name] = m
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--staleness", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--cost-steps", type=int, default=40)
    ap.add_argument("--cost-repeats", type=int, default=3)
    ap.add_argument("--cost-only", action="store_true", help="measure the cost, nothing else")
    ap.add_argument("--methods", nargs="+", default=list(METHODS))
    ap.add_argument("--out", default="runs/bench_vcpo")
    ap.add_argument("--quick", action="store_true", help="1 seed, 100 steps, eval every 25")
    a = ap.parse_args()
    if a.quick:
        a.seeds, a.steps, a.eval_every, a.cost_steps, a.cost_repeats = a.seeds[:1], 100, 25, 10, 1
    out = ROOT / a.out
    sft = warm_start(out)
    t0 = time.perf_counter()
    costs = cost(out, sft, a.cost_steps, a.cost_repeats)
    print("cost (sync):", json.dumps(costs), flush=True)
    if a.cost_only:
        return
    summary: dict = {}
    for k in a.staleness:
        summary[k] = {}
        for name in a.methods:
            rs = []
            for seed in a.seeds:
                args = [f"init={sft}", f"train.steps={a.steps}", f"eval.every={a.eval_every}",
                        f"ckpt_every={a.steps}", f"train.seed={seed}",
                        f"runtime.max_staleness={k}", *BASE, *METHODS[name]]
                rs.append(parse(run_one(out, f"s{k}_{name}_seed{seed}", args)))
            summary[k][name] = rs
            print(table({k: {name: rs}}).splitlines()[-1], flush=True)
    md = table(summary)
    base = costs["ppo"]["train_s"]
    cost_md = "\n".join(
        ["| method | train s/step (sync, median; best repeat) | x ppo | of which per-sample gradient "
         "passes |\n|---|---|---|---|"]
        + [f"| {n} | {c['train_s']:.3f} | x{c['train_s'] / base:.2f} | "
           f"{c['grad_norm_passes_s']:.3f} |" for n, c in costs.items()])
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    head = (f"commit {commit}, {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; seeds {a.seeds}, "
            f"{a.steps} steps, eval every {a.eval_every}; {time.perf_counter() - t0:.0f} s")
    text = f"{head}\n\n{cost_md}\n\n{md}\n"
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(
        {"costs": costs, "summary": {str(k): v for k, v in summary.items()}}, default=str))
    plot(summary, out / "vcpo.png")
    print(text)


if __name__ == "__main__":
    main()
