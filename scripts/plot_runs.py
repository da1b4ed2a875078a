"""One figure comparing several runs: held-out greedy accuracy and training reward against
step, one line per run (what the README shows for the built-in environments).

    python scripts/plot_runs.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x]


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, runs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
    fig, (acc, rew) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, run in runs:
        r = rows(Path(run))
        ev = [(x["step"], x["eval/greedy_accuracy"]) for x in r if "eval/greedy_accuracy" in x]
        tr = [(x["step"], x["reward/mean"]) for x in r if "reward/mean" in x]
        line = acc.plot(*zip(*ev), marker="o", label=label)[0]
        k = max(1, len(tr) // 15)  # a moving average over about 1/15 of the logged rows
        smooth = [sum(v for _, v in tr[max(0, i - k + 1):i + 1]) / len(tr[max(0, i - k + 1):i + 1])
                  for i in range(len(tr))]
        rew.plot([s for s, _ in tr], smooth, color=line.get_color(), label=label)
    acc.set(title="held-out greedy success", xlabel="RL step", ylim=(0, 1))
    rew.set(title="training reward (moving average)", xlabel="RL step")
    for ax in (acc, rew):
        ax.grid(alpha=0.3)
    acc.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    print(out)


if __name__ == "__main__":
    main()
