"""The fault soak: 20 `reroll train` runs killed with SIGKILL at random moments (1-2 kills
each, synchronous and asynchronous), plus runs killed inside a checkpoint write and inside a
resume's log truncation, each resumed until it finishes; prints per fault kind: trials,
survived, groups lost, groups trained twice, metrics rows lost or repeated.

    python benchmarks/faults.py [--trials 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "faults"))
from harness import run_trial  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--window-trials", type=int, default=5)
    a = ap.parse_args()
    plans = [("random kill -9", dict(seed=s, staleness=2 * (s % 2),
                                     plan=("random",) * (1 + s % 2))) for s in range(a.trials)]
    plans += [("kill inside a checkpoint write", dict(seed=100 + s, staleness=2 * (s % 2),
                                                      plan=("checkpoint",)))
              for s in range(a.window_trials)]
    plans += [("kill while the initial model is saved", dict(seed=300 + s, staleness=0,
                                                             plan=("init",)))
              for s in range(a.window_trials)]
    plans += [("kill inside resume truncation", dict(seed=200 + s, staleness=2 * (s % 2),
                                                     plan=("random", "truncate")))
              for s in range(a.window_trials)]
    table: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        for i, (kind, kw) in enumerate(plans):
            t = run_trial(Path(tmp) / f"t{i}", **kw)
            row = table[kind]
            row["trials"] += 1
            row["kills landed"] += sum(not k.startswith("missed") for k in t.kills)
            row["survived"] += t.survived
            row["groups lost"] += t.groups_lost
            row["groups trained twice"] += t.groups_twice
            row["metrics rows lost"] += t.rows_lost
            row["metrics rows twice"] += t.rows_twice
            print(f"{i:2d} {kind}: kills {t.kills}, resumes {t.resumes}, "
                  f"survived {t.survived}", flush=True)
    cols = ["trials", "kills landed", "survived", "groups lost", "groups trained twice",
            "metrics rows lost", "metrics rows twice"]
    print("\n| fault | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for kind, row in table.items():
        print(f"| {kind} | " + " | ".join(str(row[c]) for c in cols) + " |")
    print(f"\nwall time {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
