"""The picture of a simulated run: time per step, idle fractions and the staleness histogram
of one or more results side by side. matplotlib is imported only here."""

from __future__ import annotations

from pathlib import Path


def plot(results: dict[str, dict], out: str | Path) -> Path:
    """``results``: label -> `reroll.sim.simulate.Simulation.result`; writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(results)
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    x = range(len(labels))
    ax[0].bar(x, [results[k]["samples_per_s"] for k in labels], color="tab:blue")
    ax[0].set_title("throughput (samples/s)")
    w = 0.4
    ax[1].bar([i - w / 2 for i in x], [results[k]["gen_idle"] for k in labels], w,
              label="generation")
    ax[1].bar([i + w / 2 for i in x], [results[k]["train_idle"] for k in labels], w,
              label="training")
    ax[1].set_title("idle fraction")
    ax[1].set_ylim(0, 1)
    ax[1].legend(fontsize=8)
    lags = sorted({int(k) for r in results.values() for k in r["staleness"]})
    w = 0.8 / max(1, len(labels))
    for j, k in enumerate(labels):
        h = results[k]["staleness"]
        ax[2].bar([lag + j * w for lag in lags], [h.get(str(lag), 0.0) for lag in lags], w,
                  label=k)
    ax[2].set_title("staleness of trained groups (versions)")
    ax[2].set_xticks([lag + 0.4 - w / 2 for lag in lags], [str(lag) for lag in lags])
    ax[2].legend(fontsize=8)
    for a in ax[:2]:
        a.set_xticks(list(x), labels, rotation=20, fontsize=8)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
