"""What `runtime.gc_freeze` saves: the driver's full garbage collections during training.

A process that has loaded torch, transformers, Ray and a model holds several hundred thousand
Python objects, and a full collection, which the interpreter starts on its own once enough
long-lived objects have piled up, scans them all while every thread of the process waits.
`runtime.gc_freeze` (on by default) moves what set-up made out of the collector's sight.

For each setting (the main job, configs/arithmetic.toml, in one process as the quickstart
runs it; and under Ray with pinned cores, as `benchmarks/sim_validate.py` runs it), runs
``--steps`` steps of the untrained model (timing only) with the freeze on and off,
alternating ``--repeats`` times so that the machine's drift hits both alike, each with its
timeline (``log.timeline``). Prints per run, over the steps after the warm-up, the
throughput (samples a second, from the metrics' wall times), the longest time between two
updates, and the full collections with their total time (the timeline's ``gc`` spans); then each setting's mean throughput with the freeze on
over off.

    python benchmarks/gc_freeze.py --steps 40 --repeats 2
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
sys.path.insert(0, str(REPO))

from reroll import timeline  # noqa: E402

CONFIG = REPO / "configs" / "arithmetic.toml"
COMMON = ["log_every=1", "eval.every=0", "ckpt_every=100000", "record_every=1",
          "log.timeline=true"]
SETTINGS = {
    "local": ["reward.workers=0"],
    "ray pinned": ["runtime.threads=1", "reward.workers=0", "runtime.kind=ray",
                   "runtime.pin_cores=true"],
}
SKIP = 3  # warm-up steps left out of the throughput


def run(out: Path, setting: str, freeze: bool, steps: int) -> dict:
    args = [str(CONFIG), *COMMON, *SETTINGS[setting], f"train.steps={steps}",
            f"runtime.gc_freeze={str(freeze).lower()}", f"out_dir={out}"]
    with open(out.with_suffix(".log"), "w") as f:
        subprocess.run([sys.executable, "-m", "reroll.cli", "train", *args, "--no-progress"],
                       check=True, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "pipeline/samples_in_batch" in r][SKIP - 1:]
    samples = sum(r["pipeline/samples_in_batch"] for r in rows[1:])
    events = timeline.read(out / "timeline.json")
    trains = [e for e in events if e["name"] == "train"][SKIP - 1:]  # as the throughput
    lo, hi = trains[0]["t"], trains[-1]["end"]
    gcs = [e for e in events if e["name"] == "gc" and lo <= e["t"] <= hi]
    gaps = [b["t"] - a["t"] for a, b in zip(trains, trains[1:])]
    return {"samples_per_s": samples / (rows[-1]["time"] - rows[0]["time"]),
            "longest_interval_s": max(gaps), "collections": len(gcs),
            "collections_s": sum(e["end"] - e["t"] for e in gcs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", default=",".join(SETTINGS), help="settings, comma-separated")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    out = a.out or Path(tempfile.mkdtemp(prefix="reroll-gc-"))
    out.mkdir(parents=True, exist_ok=True)
    settings = [s.strip() for s in a.only.split(",")]
    got: dict[tuple[str, bool], list[dict]] = {}
    for rep in range(a.repeats):
        for setting in settings:
            for freeze in ((True, False) if rep % 2 == 0 else (False, True)):
                name = f"{setting.replace(' ', '_')}_{'on' if freeze else 'off'}_{rep}"
                r = run(out / name, setting, freeze, a.steps)
                got.setdefault((setting, freeze), []).append(r)
                print(f"{setting}, gc_freeze {'on ' if freeze else 'off'} (run {rep}): "
                      f"{r['samples_per_s']:.1f} samples/s, longest interval between updates "
                      f"{1e3 * r['longest_interval_s']:.0f} ms, {r['collections']} full "
                      f"collections in training ({1e3 * r['collections_s']:.0f} ms)", flush=True)
    print("\n| setting | samples/s, freeze on | off | on / off | full collections in "
          "training, on / off (ms) |\n|---|---|---|---|---|")
    for setting in settings:
        on, off = got[(setting, True)], got[(setting, False)]
        m_on = statistics.fmean(r["samples_per_s"] for r in on)
        m_off = statistics.fmean(r["samples_per_s"] for r in off)
        print(f"| {setting} | {m_on:.1f} | {m_off:.1f} | x{m_on / m_off:.3f} | "
              f"{sum(r['collections'] for r in on)} ({1e3 * sum(r['collections_s'] for r in on):.0f}) / "
              f"{sum(r['collections'] for r in off)} ({1e3 * sum(r['collections_s'] for r in off):.0f}) |")
    print(f"\nruns in {out}")


if __name__ == "__main__":
    main()
