"""`reroll report RUN_DIR`: the terminal-friendly PNG of a run, RUN_DIR/report.png, titled with
the run's name: reward (train accuracy drawn only where it differs from the reward), held-out
accuracy with its 95% Wilson interval, response length, generation throughput, the time
split per step and KL / clip fraction. The interactive page is `reroll.report_html`.
matplotlib is imported only here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from reroll import report_data as rd


def _line(ax, xs, ys, label: str | None = None, **kw) -> None:
    if len(xs) < 30:
        ax.plot(xs, ys, marker=".", label=label, **kw)
        return
    # raw values faint, a moving average over ~2% of the run on top
    avg = rd.moving_average(ys, max(2, len(ys) // 50))
    line = ax.plot(xs, ys, alpha=0.25, lw=0.6, **kw)[0]
    ax.plot(xs, avg, lw=1.6, color=line.get_color(), label=label, **kw)


def _keys(keys: list[tuple[str, str]]) -> Callable:
    def draw(ax, run: rd.Run) -> bool:
        drawn = False
        for key, label in keys:
            xs, ys = run.series(key)
            if xs:
                _line(ax, xs, ys, label)
                drawn = True
        return drawn
    return draw


def _reward(ax, run: rd.Run) -> bool:
    return _keys(rd.reward_keys(run))(ax, run)


def _held_out(ax, run: rd.Run) -> bool:
    p = rd.eval_points(run)
    if not p.x:
        return False
    err = [[a - lo for a, lo in zip(p.acc, p.low)], [h - a for h, a in zip(p.high, p.acc)]]
    ax.errorbar(p.x, p.acc, yerr=err, marker=".", capsize=2,
                label=f"greedy, n = {', '.join(map(str, sorted(set(p.n))))}")
    return True


PANELS = [
    ("reward", _reward),
    ("held-out accuracy (95% Wilson interval)", _held_out),
    ("response length", _keys([("length/mean", "mean"), ("length/max", "max")])),
    ("generation tokens/s", _keys([("throughput/gen_tokens_per_s", "tokens/s")])),
    ("time per step (s)", _keys([("time/step_s", "step"), ("time/generate_s", "generate"),
                                 ("time/train_s", "train"),
                                 ("time/wait_for_rollouts_s", "wait for rollouts")])),
    ("KL and clipping", _keys([("kl_ref", "KL to reference"), ("ppo_kl", "KL policy/proximal"),
                               ("clip_frac_low", "clipped low"),
                               ("clip_frac_high", "clipped high")])),
]


def plot_run(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = rd.load_runs([run_dir])[0]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7.4))
    for ax, (title, draw) in zip(axes.flat, PANELS):
        if draw(ax, run):
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not recorded in this run", ha="center", va="center",
                    transform=ax.transAxes, color="0.5")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.suptitle(f"reroll run {run.name} ({Path(run_dir).resolve()})", fontsize=11)
    fig.tight_layout()
    out = Path(run_dir) / "report.png"
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
