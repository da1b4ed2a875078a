"""Main-job step time before and after a change, measured in one run.

Runs the main job's RL configuration (configs/arithmetic.toml: 16 prompts x 8 samples,
synchronous GRPO, one torch thread per side) for ``--steps`` steps with this checkout and
with another commit (``--base``, checked out into a temporary git worktree), from the same
SFT warm start (built once with this checkout), alternating the two ``--repeats`` times so
that machine load hits both alike. Prints the median seconds per step of each (wall time
between consecutive steps' log rows; the first ``--skip`` steps left out) and the ratio.
Training goes through each checkout's own `train` entry point, in a fresh subprocess with that checkout first on ``sys.path``.

    python benchmarks/step_time.py --base 29c34a5 --steps 80 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import machine  # benchmarks/machine.py: the CPU a number was measured on

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "arithmetic.toml"
RUN = """
import sys
try:
    from reroll.runtime import train
except ImportError:  # a checkout from before the runtime became the composition root
    from reroll.loop import train
from reroll.config import load_config  # train checks it (older checkouts: load_config did)
train(load_config(sys.argv[1], sys.argv[2:]), progress=False)
"""


def sft_once(out: Path, steps: int) -> Path:
    if (out / "model" / "config.json").is_file():
        return out
    subprocess.run([sys.executable, "-m", "reroll.cli", "sft", str(CONFIG), f"out_dir={out}",
                    f"sft.steps={steps}"], check=True, cwd=REPO)
    return out


def run(checkout: Path, out: Path, init: Path, steps: int, extra: list[str]) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    args = [f"out_dir={out}", f"init={init}", f"train.steps={steps}", "eval.every=0",
            "log_every=1", f"ckpt_every={steps}", "record_every=0", *extra]
    subprocess.run([sys.executable, "-c", RUN, str(CONFIG), *args], check=True, env=env,
                   cwd=checkout)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) > 0]
    # wall time between consecutive rows (one per step): the whole step, publishing the
    # weights, logging and bookkeeping included, not only the loop's own time/step_s
    return [b["time"] - a["time"] for a, b in zip(rows, rows[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="29c34a5", help="commit to compare against")
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sft-steps", type=int, default=525)
    ap.add_argument("--init", type=Path, default=None,
                    help="an SFT checkpoint to start from (default: built once, here)")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="config overrides for both sides, e.g. runtime.max_staleness=1")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="reroll-steptime-"))
    base = tmp / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(base), a.base], check=True,
                   cwd=REPO, capture_output=True)
    try:
        init = a.init.resolve() if a.init else sft_once(tmp / "sft", a.sft_steps)
        times: dict[str, list[float]] = {"base": [], "this": []}
        for i in range(a.repeats):
            for side, checkout in (("base", base), ("this", REPO))[:: 1 if i % 2 == 0 else -1]:
                t = run(checkout, tmp / f"{side}{i}", init, a.steps, a.set)[a.skip:]
                times[side] += t
                print(f"repeat {i} {side}: median {statistics.median(t):.4f} s/step", flush=True)
        mb, mt = statistics.median(times["base"]), statistics.median(times["this"])
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=REPO).stdout.strip()
        print(f"base {a.base}: {mb:.4f} s/step; this checkout ({head}): {mt:.4f} s/step; "
              f"this / base = {mt / mb:.3f}" + (f"  (with {' '.join(a.set)})" if a.set else ""))
        print(machine.describe())
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO,
                       capture_output=True)


if __name__ == "__main__":
    main()
