"""`reroll report RUN_DIR`: plot a run's metrics.jsonl to RUN_DIR/report.png (matplotlib is
imported only here)."""

from __future__ import annotations

from pathlib import Path

from reroll.runlog import read_metrics

PANELS = [("reward/mean", "reward"), ("reward/accuracy", "train accuracy"),
          ("eval/greedy_accuracy", "held-out greedy accuracy"), ("length/mean", "response length"),
          ("throughput/gen_tokens_per_s", "generation tokens/s"), ("time/step_s", "step time (s)")]


def plot_run(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir)
    if not rows:
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl rows")
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, title) in zip(axes.flat, PANELS):
        pts = [(r["step"], r[key]) for r in rows if key in r]
        if pts:
            xs, ys = zip(*pts)
            if len(pts) < 30:
                ax.plot(xs, ys, marker=".")
            else:  # raw values faint, a moving average over ~2% of the run on top
                w = max(2, len(ys) // 50)
                avg = [sum(ys[max(0, i - w + 1): i + 1]) / len(ys[max(0, i - w + 1): i + 1])
                       for i in range(len(ys))]
                ax.plot(xs, ys, alpha=0.25, lw=0.6)
                ax.plot(xs, avg, lw=1.6)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(run_dir) / "report.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
