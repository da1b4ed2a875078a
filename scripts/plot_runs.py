"""One figure comparing several runs: held-out greedy accuracy and training reward against
step, one line per run (the figure docs/ shows for the built-in environments). The numbers
come from `reroll.report_data`, the same reading as `reroll report`.

    python scripts/plot_runs.py OUT.png LABEL=RUN_DIR [LABEL=RUN_DIR ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

from reroll import report_data as rd


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out, pairs = Path(sys.argv[1]), [a.split("=", 1) for a in sys.argv[2:]]
    runs = rd.load_runs([run for _, run in pairs])
    fig, (acc, rew) = plt.subplots(1, 2, figsize=(10, 3.6))
    for (label, _), run in zip(pairs, runs):
        ev = rd.eval_points(run)
        line = acc.plot(ev.x, ev.acc, marker="o", label=label)[0]
        xs, ys = run.series("reward/mean")
        # a moving average over about 1/15 of the logged rows
        rew.plot(xs, rd.moving_average(ys, max(1, len(ys) // 15)), color=line.get_color(),
                 label=label)
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
