"""Off-policy corrections on stale rollouts: decoupled PPO (truncated IS), masked IS, VCPO,
MinPRO, M2PO, PPO-EWMA, per-version snapshots and a combination at ``runtime.max_staleness``
4, 8 and 16 on the main job (``configs/arithmetic.toml``) from its SFT checkpoint, or on
another job (``--config``) from an SFT checkpoint given with ``--init`` (the reasoning job's
two-stage SFT is `scripts/reasoning.sh`'s, not one ``reroll sft``).

Methods, each from the same SFT checkpoint with the main job's settings; only the keys
below differ (docs/algorithms.md describes each):

- ``ppo_tis``: decoupled PPO, per-token IS truncated at 2 (the defaults);
- ``mis``: masked IS (``mis_token``: a token whose ratio exceeds 2 leaves the loss);
- ``vcpo``: VCPO's ESS-scaled learning rate and its OPOB baseline;
- ``minpro``: MinPRO's prefix minimum times the truncated ratio;
- ``m2po``: M2PO's second-moment mask (threshold 0.04);
- ``ppo_ewma``: pi_prox from a moving average of the weights (``train.prox_ema`` 0.9);
- ``snapshots``: each stale token's pi_prox under its own version's weights
  (``train.old_snapshots`` = max_staleness + 1: every version a token can carry, so the cap
  never evicts; the snapshots held are the ones the loop's groups reference);
- ``ewma_minpro``: the combination, PPO-EWMA's averaged pi_prox with MinPRO's prefix-aware
  weight on the ratio that is left. The two act on different factors (the proximal anchor
  and the IS weight), so they compose; snapshots do not compose with PPO-EWMA (both set
  pi_prox), and with snapshots every IS correction sees only the engine/trainer mismatch,
  which on this CPU job is 1 (the screen's ESS 1.000), so snapshots + X would measure
  snapshots alone. Chosen before the measurement, from the 40-step screen (MinPRO's best
  cheap accuracy, PPO-EWMA's highest cheap ESS); both cost no forward pass.

Per run: the held-out greedy accuracy curve, the share of evaluations after the start that
fall below the start and their mean (the curve's height: how soon it rose), the token ESS of the correction (``is/ess``: mean and minimum over
steps), the share of tokens the correction truncated or masked, the mean version lag, the
median train and whole-step seconds per step, the run's peak resident memory (the largest
process's ``ru_maxrss``, read by a wrapper process around ``reroll train``) and the most
snapshot bytes held (``offpol/snapshot_bytes``).

    nice -n 10 .venv/bin/python benchmarks/offpolicy.py [--seeds 0 1 2] [--staleness 4 8 16]
        [--steps 600] [--eval-every 50] [--eval-examples 500] [--out runs/bench_offpolicy]
    .venv/bin/python benchmarks/offpolicy.py --config configs/reasoning.toml \
        --init runs/reasoning/sft --eval-examples 200 --out runs/bench_offpolicy_reasoning

Finished runs are reused on a rerun with the same arguments. Results: OUT/results.md and
OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vcpo import CONFIG, REROLL, mean_sd, read_rows, run_one, warm_start  # noqa: E402  (same runner, SFT start, table cells)

ROOT = Path(__file__).resolve().parent.parent
BASE = ["log_every=1", "record_every=0"]
METHODS: dict[str, list[str]] = {
    "ppo_tis": [],
    "mis": ["algo.correction=mis_token"],
    "vcpo": ["algo.ess_lr=true", "algo.advantage=opob"],
    "minpro": ["algo.correction=minpro"],
    "m2po": ["algo.correction=m2po"],
    "ppo_ewma": ["train.prox_ema=0.9"],
    "snapshots": ["train.old_snapshots={cap}"],
    "ewma_minpro": ["train.prox_ema=0.9", "algo.correction=minpro"],
}
# runs ``reroll train`` as a child and writes its peak RSS (kB: the largest descendant's)
PEAK = ("import json, resource, subprocess, sys; rc = subprocess.call(sys.argv[2:]); "
        "open(sys.argv[1], 'w').write(json.dumps({'maxrss_kb': "
        "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss})); sys.exit(rc)")


def parse(run: Path, max_staleness: int = 0) -> dict:
    """One run's summary (see the module docstring); the lag also after the ramp-up (steps
    past ``max_staleness``, when the generator can first be that far ahead)."""
    rows = read_rows(run)
    steps = [r for r in rows if r["step"] > 0]
    evals = [(r["step"], r["eval/greedy_accuracy"]) for r in rows if "eval/greedy_accuracy" in r]
    accs = [a for _, a in evals]
    start = accs[0] if accs else math.nan
    later = accs[1:]
    ess = [r["is/ess"] for r in steps if "is/ess" in r]
    return {
        "evals": evals, "start_acc": start,
        "final_acc": accs[-1] if accs else math.nan,
        "best_acc": max(accs) if accs else math.nan,
        "below_start": sum(a < start for a in later) / len(later) if later else math.nan,
        "mean_after": statistics.fmean(later) if later else math.nan,
        "ess_mean": statistics.fmean(ess) if ess else math.nan,
        "ess_min": min(ess) if ess else math.nan,
        "dropped": statistics.fmean(r.get("is/dropped_frac", 0.0) for r in steps),
        "lag_mean": statistics.fmean(r.get("staleness/mean_lag", 0.0) for r in steps),
        "lag_steady": statistics.fmean([r.get("staleness/mean_lag", 0.0) for r in steps
                                        if r["step"] > max_staleness] or [math.nan]),
        "train_s_median": statistics.median(r["time/train_s"] for r in steps),
        "step_s_median": statistics.median(r["time/step_s"] for r in steps),
        "peak_rss_mb": peak_rss(run) / 1024,
        "snapshot_mb": max((r.get("offpol/snapshot_bytes", 0.0) for r in steps),
                           default=0.0) / 2**20,
        "snapshots_held": max((r.get("offpol/snapshots_held", 0.0) for r in steps),
                              default=0.0),
    }


def peak_rss(run: Path) -> float:
    """The run's peak RSS in kB (``PEAK``'s record), NaN for a run made without it."""
    p = run / "peak_rss.json"
    return json.loads(p.read_text())["maxrss_kb"] if p.is_file() else math.nan


def run_measured(out: Path, tag: str, args: list[str], config: str = CONFIG) -> Path:
    """`vcpo.run_one` with ``reroll train`` inside ``PEAK``'s wrapper (its record lands in
    the run directory; a finished run is reused as there)."""
    run = out / "runs" / tag
    cmd = [sys.executable, "-c", PEAK, str(run / "peak_rss.json"), REROLL]
    return run_one(out, tag, args, launcher=cmd, config=config)


def table(summary: dict) -> str:
    lines = ["| max_staleness | method | held-out acc: start -> final (best) | mean of the "
             "later evals | evals below start | token ESS mean / min | truncated or masked | mean lag (after ramp-up) | "
             "train s/step | "
             "step s | peak RSS MB | snapshots held (MB) |",
             "|" + "---|" * 12]
    for k, methods in summary.items():
        for name, rs in methods.items():
            lines.append(
                f"| {k} | {name} | {mean_sd([r['start_acc'] for r in rs])} -> "
                f"{mean_sd([r['final_acc'] for r in rs])} "
                f"({mean_sd([r['best_acc'] for r in rs])}) | "
                f"{mean_sd([r['mean_after'] for r in rs])} | "
                f"{mean_sd([r['below_start'] for r in rs], '.2f')} | "
                f"{mean_sd([r['ess_mean'] for r in rs])} / "
                f"{min(r['ess_min'] for r in rs):.3f} | "
                f"{mean_sd([r['dropped'] for r in rs], '.4f')} | "
                f"{statistics.fmean(r['lag_mean'] for r in rs):.2f} "
                f"({statistics.fmean(r['lag_steady'] for r in rs):.2f}) | "
                f"{mean_sd([r['train_s_median'] for r in rs])} | "
                f"{mean_sd([r['step_s_median'] for r in rs])} | "
                f"{mean_sd([r['peak_rss_mb'] for r in rs], '.0f')} | "
                f"{max(r['snapshots_held'] for r in rs):.0f} "
                f"({max(r['snapshot_mb'] for r in rs):.1f}) |")
    return "\n".join(lines)


def mean_curves(summary: dict) -> str:
    """Held-out accuracy at each evaluation, mean over seeds, one row per method."""
    steps = sorted({s for ms in summary.values() for rs in ms.values() for r in rs
                    for s, _ in r["evals"]})
    lines = ["| max_staleness | method | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|" + "---|" * (len(steps) + 2)]
    for k, methods in summary.items():
        for name, rs in methods.items():
            cells = []
            for s in steps:
                v = [a for r in rs for t, a in r["evals"] if t == s]
                cells.append(f"{statistics.fmean(v):.3f}" if v else "-")
            lines.append(f"| {k} | {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cpu() -> str:
    """The CPU's model name (Linux), else the machine type."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def curves(summary: dict) -> str:
    """The held-out accuracy curves as text: step: accuracy, per run."""
    out = []
    for k, methods in summary.items():
        for name, rs in methods.items():
            for i, r in enumerate(rs):
                pts = ", ".join(f"{s}: {a:.3f}" for s, a in r["evals"])
                out.append(f"- max_staleness {k}, {name}, seed index {i}: {pts}")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--staleness", type=int, nargs="+", default=[4])
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-examples", type=int, default=500)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--out", default="runs/bench_offpolicy", help="relative to the repository "
                    "root, or absolute")
    ap.add_argument("--config", default=CONFIG, help="the job (default: the main job's)")
    ap.add_argument("--init", default=None, help="the SFT run to start from (default: the "
                    "main job's, made once in OUT/sft); needed with another --config")
    a = ap.parse_args()
    if a.init is None and a.config != CONFIG:
        ap.error(f"--config {a.config} needs --init: only the main job's SFT warm start is "
                 f"made here")
    out = ROOT / a.out
    sft = Path(a.init).resolve() if a.init else warm_start(out)
    t0 = time.perf_counter()
    summary: dict = {}
    for k in a.staleness:
        summary[k] = {}
        for name in a.methods:
            rs = []
            for seed in a.seeds:
                args = [f"init={sft}", f"train.steps={a.steps}", f"eval.every={a.eval_every}",
                        f"eval.n_examples={a.eval_examples}", f"ckpt_every={a.steps}",
                        f"train.seed={seed}", f"runtime.max_staleness={k}", *BASE,
                        *[x.format(cap=k + 1) for x in METHODS[name]]]
                run = run_measured(out, f"s{k}_{name}_seed{seed}", args, a.config)
                rs.append(parse(run, k))
            summary[k][name] = rs
            print(table({k: {name: rs}}).splitlines()[-1], flush=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "?"
    head = (f"commit {commit}, {time.strftime('%Y-%m-%d')}, {cpu()}, "
            f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; {a.config} from {sft}; "
            f"seeds {a.seeds}, "
            f"{a.steps} steps, eval every {a.eval_every} on {a.eval_examples} examples; "
            f"{time.perf_counter() - t0:.0f} s")
    text = f"{head}\n\n{table(summary)}\n\n{mean_curves(summary)}\n\n{curves(summary)}\n"
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({str(k): v for k, v in summary.items()}))
    print(text)


if __name__ == "__main__":
    main()
