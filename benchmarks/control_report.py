"""Curves, summaries, tables and plots of the Control benchmark (`benchmarks/control.py`),
shared with `benchmarks/replay.py`: a run's evaluation points and diagnostics read from its
``metrics.jsonl`` and rollout store, smoothing and target crossings, the per-method summary
over seeds, the markdown tables and the accuracy-vs-tokens / -vs-seconds plots.

Owns no runs: it reads the directories `control.py` writes.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import numpy as np

LEVELS = ("easy", "medium", "hard")


def read_rows(run: Path) -> list[dict]:
    p = run / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def training_mix(run: Path) -> dict:
    """From the recorded groups: share of trained samples per level, share of trained
    samples in groups with both outcomes (a nonzero GRPO advantage), success rate per level.
    Pruned samples (finish "pruned": out of the loss) are not trained samples."""
    from reroll.recording.store import RolloutStore

    n = {lv: 0 for lv in LEVELS}
    ok = {lv: 0 for lv in LEVELS}
    mixed, total = 0, 0
    for _, g in RolloutStore(run).groups():
        lv = g.example.fields.get("difficulty", "?")
        vals = [float(r.reward or 0.0) for r in g.rollouts if r.finish != "pruned"]
        succ = sum(v >= 1.0 - 1e-9 for v in vals)
        n[lv] = n.get(lv, 0) + len(vals)
        ok[lv] = ok.get(lv, 0) + succ
        total += len(vals)
        mixed += len(vals) if 0 < succ < len(vals) else 0
    return {"samples": total,
            "level_share": {lv: n[lv] / max(1, total) for lv in n},
            "level_success": {lv: ok[lv] / n[lv] if n[lv] else None for lv in n},
            "informative_share": mixed / max(1, total)}


# ---- curves -----------------------------------------------------------------------------
def parse(run: Path) -> dict:
    """Evaluation points (step, tokens, training seconds, accuracy, per level) and the
    run's control diagnostics."""
    rows = read_rows(run)
    tokens, train_s, eval_s = 0.0, 0.0, 0.0
    pts = []
    steps = [r for r in rows if r["step"] > 0]
    for r in rows:
        if r["step"] > 0:
            tokens = r["pipeline/tokens_generated"]
            train_s += r["time/step_s"]
        eval_s += r.get("time/eval_s", 0.0)
        if "eval/greedy_accuracy" in r:
            pts.append({"step": r["step"], "tokens": tokens, "train_s": train_s,
                        "acc": r["eval/greedy_accuracy"],
                        **{lv: r.get(f"eval/greedy_accuracy_{lv}") for lv in LEVELS}})
    price = [r["control/price"] for r in steps if "control/price" in r]
    pruned = [r for r in steps if "control/arrol_pruned" in r]
    head = [r["arrol/head_accuracy"] for r in steps[-50:] if "arrol/head_accuracy" in r]
    diag = {
        "group_size_mean": statistics.fmean(r["control/group_size_mean"] for r in steps),
        "group_size_max": max(r["control/group_size_max"] for r in steps),
        "rounds_mean": statistics.fmean(r["control/rounds_mean"] for r in steps),
        "groups_per_step": statistics.fmean(r["pipeline/groups_in_batch"] for r in steps),
        "samples_per_step": statistics.fmean(r["pipeline/samples_in_batch"] for r in steps),
        "tokens_per_step": tokens / len(steps),
        "step_s_median": statistics.median(r["time/step_s"] for r in steps),
        "train_s": train_s, "eval_s": eval_s,
        "price_first": price[0] if price else None, "price_last": price[-1] if price else None,
        "price_min": min(price) if price else None, "price_max": max(price) if price else None,
        "train_reward_last50": statistics.fmean(r["reward/mean"] for r in steps[-50:]),
        "arrol_pruned_per_step": statistics.fmean(r["control/arrol_pruned"] for r in pruned)
        if pruned else None,
        "arrol_early_per_step": statistics.fmean(r["control/arrol_finished_early"]
                                                 for r in pruned) if pruned else None,
        "arrol_mixed_groups": statistics.fmean(r["control/arrol_mixed_groups"] for r in pruned)
        if pruned else None,
        "arrol_head_accuracy_last50": statistics.fmean(head) if head else None,
    }
    mix = run / "mix.json"
    if mix.is_file():
        diag["mix"] = json.loads(mix.read_text())
    return {"points": pts, "diag": diag}


def smooth(y: list[float], w: int) -> list[float]:
    """Centred moving average over ``w`` evaluations (shorter at the ends); the first point,
    the SFT start that every method shares, is kept as measured."""
    if w <= 1:
        return list(y)
    h = w // 2
    return y[:1] + [statistics.fmean(y[max(0, i - h): i + h + 1]) for i in range(1, len(y))]


def first_at(xs: list[float], ys: list[float], target: float) -> float | None:
    """x of the first point after the start (the shared SFT evaluation) whose y is at or
    above ``target`` (None: never)."""
    return next((x for x, y in list(zip(xs, ys))[1:] if y >= target - 1e-9), None)


def mean_sd(v: list[float]) -> tuple[float, float]:
    if not v:
        return math.nan, math.nan
    return statistics.fmean(v), (statistics.stdev(v) if len(v) > 1 else 0.0)


def seed_mean_curve(runs: list[dict], w: int) -> dict:
    """Seeds evaluate at the same steps: mean tokens, seconds and smoothed accuracy per
    evaluation, and the sd over seeds of the smoothed accuracy."""
    n = min(len(r["points"]) for r in runs)
    sm = [smooth([p["acc"] for p in r["points"][:n]], w) for r in runs]
    return {
        "tokens": [statistics.fmean(r["points"][i]["tokens"] for r in runs) for i in range(n)],
        "train_s": [statistics.fmean(r["points"][i]["train_s"] for r in runs) for i in range(n)],
        "acc": [statistics.fmean(s[i] for s in sm) for i in range(n)],
        "sd": [statistics.stdev([s[i] for s in sm]) if len(sm) > 1 else 0.0 for i in range(n)],
    }


def final(points: list[dict], key: str = "acc", last: int = 3) -> float:
    vals = [p[key] for p in points[-last:] if p[key] is not None]
    return statistics.fmean(vals) if vals else math.nan


def summarise(runs: dict[str, list[dict]], target: float, w: int, t_eq: float,
              baseline: dict[str, str] | None = None) -> dict:
    """Per method: tokens and seconds to ``target``, accuracy at ``t_eq`` tokens, finals and
    diagnostics, with ratios against ``fixed`` (or the method's own ``baseline[name]``)."""
    baseline = baseline or {}
    out = {}
    for name, rs in runs.items():
        tok, sec, at_eq = [], [], []
        for r in rs:
            xs = [p["tokens"] for p in r["points"]]
            ys = smooth([p["acc"] for p in r["points"]], w)
            i = next((j for j, y in enumerate(ys) if j > 0 and y >= target - 1e-9), None)
            if i is not None:
                tok.append(r["points"][i]["tokens"])
                sec.append(r["points"][i]["train_s"])
            at_eq.append(float(np.interp(t_eq, xs, ys)))
        mc = seed_mean_curve(rs, w)
        d = [r["diag"] for r in rs]
        out[name] = {
            "reached": len(tok), "seeds": len(rs),
            "tokens_to_target": mean_sd(tok), "tokens_to_target_per_seed": tok,
            "train_s_to_target": mean_sd(sec), "train_s_to_target_per_seed": sec,
            "tokens_to_target_mean_curve": first_at(mc["tokens"], mc["acc"], target),
            "train_s_to_target_mean_curve": first_at(mc["train_s"], mc["acc"], target),
            "acc_at_equal_tokens": mean_sd(at_eq),
            "final_acc": mean_sd([final(r["points"]) for r in rs]),
            "final_acc_per_seed": [final(r["points"]) for r in rs],
            **{f"final_{lv}": mean_sd([final(r["points"], lv) for r in rs]) for lv in LEVELS},
            "start_acc": statistics.fmean(r["points"][0]["acc"] for r in rs),
            "final_tokens": mean_sd([r["points"][-1]["tokens"] for r in rs]),
            "final_train_s": mean_sd([r["points"][-1]["train_s"] for r in rs]),
            "diag": {k: statistics.fmean(x[k] for x in d) if d[0][k] is not None else None
                     for k in d[0] if k != "mix"},
            "mix": {
                "level_share": {lv: statistics.fmean(x["mix"]["level_share"].get(lv, 0.0)
                                                     for x in d) for lv in LEVELS},
                "level_success": {lv: statistics.fmean(
                    x["mix"]["level_success"][lv] for x in d
                    if x["mix"]["level_success"].get(lv) is not None) if any(
                    x["mix"]["level_success"].get(lv) is not None for x in d) else None
                    for lv in LEVELS},
                "informative_share": statistics.fmean(x["mix"]["informative_share"] for x in d),
            } if all("mix" in x for x in d) else None,
            "mean_curve": mc,
        }
    for name, m in out.items():
        base = out.get(baseline.get(name, "fixed"), out["fixed"])
        m["baseline"] = baseline.get(name, "fixed") if base is not out["fixed"] else "fixed"
        b, x = base["tokens_to_target"][0], m["tokens_to_target"][0]
        full = m["reached"] == m["seeds"] and base["reached"] == base["seeds"]
        m["ratio_tokens"] = b / x if full and x > 0 else None
        bt, xt = base["train_s_to_target"][0], m["train_s_to_target"][0]
        m["ratio_time"] = bt / xt if full and xt > 0 else None
        bc, xc = base["tokens_to_target_mean_curve"], m["tokens_to_target_mean_curve"]
        m["ratio_tokens_mean_curve"] = bc / xc if bc and xc else None
        bs, xs = base["train_s_to_target_mean_curve"], m["train_s_to_target_mean_curve"]
        m["ratio_time_mean_curve"] = bs / xs if bs and xs else None
    return out


# ---- output -----------------------------------------------------------------------------
def fmt(ms: tuple[float, float], scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
    m, s = ms
    if math.isnan(m):
        return "not reached"
    return f"{m / scale:.{digits}f} +- {s / scale:.{digits}f}{unit}"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def table(summary: dict, target: float, t_eq: float) -> str:
    head = (f"| method | tokens to {target:.3f} (k, seeds reached) | fixed / method | "
            f"same, seed-mean curve | train s to {target:.3f} | fixed / method (time) | "
            f"acc at {t_eq / 1e3:.0f}k tokens | final acc | final easy / medium / hard | "
            f"samples per group (max) | rounds | s per step |")
    lines = [head, "|" + "---|" * 12]
    for name, m in summary.items():
        reach = f" ({m['reached']}/{m['seeds']})"
        mc = m["tokens_to_target_mean_curve"]
        lvl = " / ".join(f"{m[f'final_{lv}'][0]:.3f}" for lv in LEVELS)
        dg = m["diag"]
        label = name if m["baseline"] == "fixed" else f"{name} (vs {m['baseline']})"
        lines.append(
            f"| {label} | {fmt(m['tokens_to_target'], 1e3)}{reach} | {ratio(m['ratio_tokens'])} "
            f"| {'not reached' if mc is None else f'{mc / 1e3:.1f}'} "
            f"({ratio(m['ratio_tokens_mean_curve'])}) "
            f"| {fmt(m['train_s_to_target'], 1.0, 1, ' s')} | {ratio(m['ratio_time'])} "
            f"| {fmt(m['acc_at_equal_tokens'], 1.0, 3)} | {fmt(m['final_acc'], 1.0, 3)} "
            f"| {lvl} | {dg['group_size_mean']:.2f} ({dg['group_size_max']:.0f}) "
            f"| {dg['rounds_mean']:.2f} | {dg['step_s_median']:.3f} |")
    return "\n".join(lines)


def mix_table(summary: dict) -> str:
    lines = ["| method | trained samples easy / medium / hard | train success easy / medium "
             "/ hard | samples in mixed-outcome groups | groups per step | tokens per step "
             "| price first -> last (min..max) |", "|" + "---|" * 7]
    for name, m in summary.items():
        mx, dg = m["mix"], m["diag"]
        if mx is None:
            continue
        share = " / ".join(f"{mx['level_share'][lv]:.0%}" for lv in LEVELS)
        succ = " / ".join("-" if mx["level_success"][lv] is None
                          else f"{mx['level_success'][lv]:.0%}" for lv in LEVELS)
        price = ("-" if dg["price_first"] is None else
                 f"{dg['price_first']:.4f} -> {dg['price_last']:.4f} "
                 f"({dg['price_min']:.4f}..{dg['price_max']:.4f})")
        lines.append(f"| {name} | {share} | {succ} | {mx['informative_share']:.0%} | "
                     f"{dg['groups_per_step']:.1f} | {dg['tokens_per_step']:.0f} | {price} |")
    return "\n".join(lines)


STYLE = {"fixed": ("black", "-", 2.5)}


TITLE = "reroll Control stage vs fixed-n GRPO (same SFT start, same samples per step)"


def plot(summary: dict, x: str, target: float, path: Path, xlabel: str, *,
         title: str = TITLE, labels: dict[str, str] | None = None) -> None:
    """Seed-mean smoothed accuracy per method against ``x`` (tokens or train_s), +-1 sd
    band; ``labels`` renames methods in the legend (benchmarks/replay.py uses it too)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 6))
    colors = plt.get_cmap("tab10").colors
    for i, (name, m) in enumerate(summary.items()):
        mc = m["mean_curve"]
        xs = np.array(mc[x]) / (1e3 if x == "tokens" else 1.0)
        ys, sd = np.array(mc["acc"]), np.array(mc["sd"])
        color, ls, lw = STYLE.get(name, (colors[i % 10], "--" if any(
            k in name for k in ("dots", "vade", "select")) and "+" not in name else
            (":" if "+" in name else "-"), 1.4))
        label = (labels or {}).get(name, name)
        ax.plot(xs, ys, color=color, ls=ls, lw=lw, label=f"{label} ({m['seeds']} seeds)")
        ax.fill_between(xs, ys - sd, ys + sd, color=color, alpha=0.08)
    ax.axhline(target, color="gray", lw=0.8, ls="-.", label=f"target {target:.3f}")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("held-out greedy accuracy (arith_mixed, 300 prompts; smoothed, seed mean)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
