"""What leaving zero-advantage samples out of the loss's passes saves (train.skip_zero_advantage).

For each config (the main job, configs/arithmetic.toml, and the mixed-difficulty task,
configs/mixed.toml, whose easy prompts are often all right and hard ones all wrong), from
one SFT warm start per config (built once, or ``--init``), runs synchronous GRPO for
``--steps`` steps with the skip on and off, alternating ``--repeats`` times so that machine
load hits both alike. Prints per setting the median update time (``time/train_s``), the
median whole step (wall time between log rows), the mean share of samples skipped, and the
held-out greedy accuracy at the end (the same update up to float rounding, so the same
accuracy within evaluation noise); then the ratios.

    python benchmarks/skip_inert.py --steps 150 --repeats 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = {"main": REPO / "configs" / "arithmetic.toml", "mixed": REPO / "configs" / "mixed.toml"}


def sh(args: list[str], log: Path) -> None:
    with open(log, "w") as f:
        subprocess.run([sys.executable, "-m", "reroll.cli", *args], check=True, cwd=REPO,
                       stdout=f, stderr=subprocess.STDOUT)


def run(config: Path, init: Path, out: Path, steps: int, skip: bool) -> dict[str, float]:
    sh(["train", str(config), f"out_dir={out}", f"init={init}", f"train.steps={steps}",
        f"eval.every={steps}", "log_every=1", f"ckpt_every={steps}", "record_every=0",
        f"train.skip_zero_advantage={str(skip).lower()}"], out.with_suffix(".log"))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows[1:] if "time/train_s" in r]
    walls = [b["time"] - a["time"] - b.get("time/eval_s", 0.0)
             for a, b in zip(rows[1:], rows[2:])]
    return {"train_s": statistics.median(r["time/train_s"] for r in steps_rows[10:]),
            "step_s": statistics.median(walls[10:]),
            "skipped": statistics.fmean(r.get("train/skipped_share", 0.0) for r in steps_rows),
            "accuracy": [r["eval/greedy_accuracy"] for r in rows if "eval/greedy_accuracy" in r][-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default="main,mixed")
    ap.add_argument("--init", action="append", default=[],
                    help="NAME=SFT_DIR: an SFT checkpoint of that config to start from")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="reroll-skip-"))
    out.mkdir(parents=True, exist_ok=True)
    given = dict(x.split("=", 1) for x in a.init)
    for name in a.only.split(","):
        config = CONFIGS[name]
        init = Path(given[name]) if name in given else out / f"sft_{name}"
        if name not in given and not (init / "model" / "config.json").is_file():
            sh(["sft", str(config), f"out_dir={init}"], out / f"sft_{name}.log")
        res: dict[bool, list[dict[str, float]]] = {True: [], False: []}
        for rep in range(a.repeats):
            for skip in ((True, False) if rep % 2 == 0 else (False, True)):
                r = run(config, init, out / f"{name}_{'skip' if skip else 'full'}_{rep}",
                        a.steps, skip)
                res[skip].append(r)
                print(f"{name} skip={skip!s:5s} repeat {rep}: update {r['train_s']:.4f} s, "
                      f"step {r['step_s']:.4f} s, skipped {r['skipped']:.1%}, held-out "
                      f"{r['accuracy']:.3f}", flush=True)
        agg = {s: {k: statistics.fmean(r[k] for r in rs) for k in rs[0]}
               for s, rs in res.items()}
        on, off = agg[True], agg[False]
        print(f"{name}: update {on['train_s']:.4f} vs {off['train_s']:.4f} s "
              f"(x{off['train_s'] / on['train_s']:.2f} faster), step {on['step_s']:.4f} vs "
              f"{off['step_s']:.4f} s (x{off['step_s'] / on['step_s']:.2f}), skipped "
              f"{on['skipped']:.1%} of samples, held-out {on['accuracy']:.3f} vs "
              f"{off['accuracy']:.3f}\n", flush=True)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO).stdout.strip()
    print(f"commit {head}, {a.steps} steps x {a.repeats} repeats per setting")


if __name__ == "__main__":
    main()
