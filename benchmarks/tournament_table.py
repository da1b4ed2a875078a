"""The tournament's bookkeeping, pure: a run's metrics rows read into its curve (training
seconds with evaluation left out, tokens from the running total), when a run stops, the
figures that say why a method pays or not, each method's paper headline, and the summary
over seeds and the markdown table of the results file (benchmarks/tournament.py runs the
rows; tests/test_tournament_table.py checks this module by hand). Knows no process, run
directory layout or clock."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# each method's own headline claim, as its paper states it (their models, tasks and
# hardware, not this workload's), printed beside the row; reroll's own rows have none
PAPER = {
    **dict.fromkeys(("async1", "async2", "async4"),
                    "AReaL: up to 2.77x sooner end to end than synchronous, same accuracy"),
    "april": "APRIL: rollout throughput +22.5% on average (up to +44%)",
    "dapo_ds": "DAPO (whole recipe): 50 on AIME24 in half the steps of R1-Zero-Qwen-32B",
    "duet": "DUET: 1.62x wall clock over full-budget GRPO, higher accuracy",
    "arrol": "ARRoL: up to 1.7x training speed-up, +2.3 to +3.0 accuracy",
    **dict.fromkeys(("ar3po", "ar3po_alloc", "ar3po_reuse"),
                    "AR3PO: DAPO's accuracy at up to 4.2x lower rollout cost"),
    "dars": "DARS: Pass@K gains at no extra inference cost at convergence",
    "xrpo": "XRPO: up to 2.7x faster convergence, up to +4% pass@1",
    "vade": "VADE: better accuracy and sample efficiency than filtering baselines",
    "gdro_prompt": "Prompt-GDRO: +10.6% relative pass@8 over GRPO",
    "gdro_rollout": "Rollout-GDRO: +10.1% relative pass@8 over GRPO",
    "dots_rr": "DOTS+RR: GRPO's accuracy in 23-62% less RL time",
    **dict.fromkeys(("spec_rl", "spec_rl_pool"),
                    "SPEC-RL: 2-3x shorter rollout time, no accuracy lost"),
    **dict.fromkeys(("das", "das_pool"),
                    "DAS: rollout time up to 50% lower, identical training curves"),
    "latr": "LATR: policy learning 131% faster on average, +4.2% pass@1",
    "treerl": "TreeRL: above independent-chain RL at the same token budget (no single figure)",
    **dict.fromkeys(("vcpo4", "vcpo8"),
                    "VCPO: lag-2 async reaches sync's best AIME-25 accuracy 2.5x sooner"),
    "siri": "SIRI: AIME24 +43.2% with 46.9% fewer tokens (1.5B, three cycles)",
    "dot": "DOT: 78% fewer tokens on AIME24, accuracy above the starting policy",
    "mc_grpo": "MC-GRPO: 2 samples a prompt within 1% of 8's accuracy",
}


# the figures that say why a method pays or not: per-step values, averaged over a run's
# logged steps, and running totals (the pipeline's and the drafter's counters), given as
# their increase a step; a drafter's acceptance is its accepted over proposed tokens
WHY = ("prune/pruned_frac", "pipeline/samples_in_batch", "offpol/ess", "length/mean",
       "length/clipped_share", "control/arrol_pruned", "control/arrol_tokens_saved_est",
       "arrol/head_s", "staleness/mean_lag", "shaping/shaped_share")


RUNNING = ("pipeline/started", "pipeline/dropped_zero_variance", "draft/samples_drafted",
           "draft/tokens_proposed", "draft/tokens_accepted")


def read_rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] \
        if path.exists() else []


def train_seconds(rows: list[dict]) -> float:
    """Training wall time so far: the clock between the first and last row, evaluation out."""
    if len(rows) < 2:
        return 0.0
    return rows[-1]["time"] - rows[0]["time"] - sum(r.get("time/eval_s", 0.0) for r in rows[1:])


def curve_of(rows: list[dict], start_accuracy: float | None = None) -> list[tuple]:
    """(step, training seconds, held-out accuracy, tokens generated) at each evaluation. Step
    0's accuracy is row 0's own, or ``start_accuracy`` where row 0 carries none (a run with
    ``eval.at_start = false``, its start evaluated once for every row)."""
    if not rows:
        return []
    acc0 = rows[0].get("eval/greedy_accuracy", start_accuracy)
    if acc0 is None:
        raise ValueError(f"curve_of: row 0 ({rows[0]}) has no eval/greedy_accuracy and no "
                         f"start_accuracy was given")
    start, evals, tokens = rows[0]["time"], 0.0, 0
    curve = [(0, 0.0, acc0, 0)]
    for r in rows[1:]:
        evals += r.get("time/eval_s", 0.0)
        tokens = r.get("pipeline/tokens_generated", tokens)  # a running total
        if "eval/greedy_accuracy" in r:
            curve.append((r["step"], r["time"] - start - evals, r["eval/greedy_accuracy"],
                          tokens))
    return curve


def limit_of(curve: list[tuple], target: float, cap_s: float | None, cap_x: float | None,
             stop_at_target: bool, hold: int = 1) -> float | None:
    """Training seconds at which a run stops: ``cap_s`` if given (a row capped at a multiple
    of sync's time); else ``cap_x`` times its own time to ``target`` once it gets there
    (sync); the time it reaches ``target`` when ``stop_at_target`` (the screen). Reaching
    it is `reach`'s, with ``hold``: a run goes on until the evaluations confirm it."""
    hit = reach(curve[1:], target, hold)
    if stop_at_target and hit is not None:
        return hit[1]
    if cap_s is not None:
        return cap_s
    return cap_x * hit[1] if cap_x is not None and hit is not None else None


def sync_cap(sync: dict, cap: float) -> float:
    """The training seconds a seed's other rows stop at: ``cap`` times the time its sync run
    (a results record) took to its target, or to its end where it never got there."""
    hit = reach(sync["curve"][1:], sync["target"], hold_of(sync))
    return cap * (hit[1] if hit else sync["curve"][-1][1])


def recorded(results: list[dict], row: str, seed: int, **same) -> dict | None:
    """The latest record of ``row`` and ``seed`` in ``results`` whose fields equal ``same``
    (machine, commit, start, target, protocol, evaluation settings), or None."""
    return next((r for r in reversed(results) if r["row"] == row and r["seed"] == seed
                 and all(_field(r, k) == v for k, v in same.items())), None)


def _field(record: dict, key: str):
    """A results row's field, ``hold`` defaulted for rows recorded before it existed."""
    return hold_of(record) if key == "hold" else record.get(key)


def capping_sync(results: list[dict], seed: int, cap: float, screen: bool,
                 max_steps: int | None = None, **same) -> dict | None:
    """The recorded sync run of ``seed`` that caps a later invocation's rows: the latest of
    the same protocol and ``same`` fields (under the full protocol, of the same ``cap``:
    sync ran to ``cap`` times its own time, which the summary's final accuracy reads); at
    ``cap`` 1 under the full protocol a screen run stands in where there is none (sync then
    stops at the evaluation that reaches the target under either protocol: the same run).
    A run that never reached the target counts only if it had ``max_steps`` too: with fewer
    it may have stopped short, and its end would set too small a cap."""
    rec = recorded(results, "sync", seed, **same, screen=screen,
                   **({} if screen else {"cap": cap}))
    if rec is None and cap == 1 and not screen:
        rec = recorded(results, "sync", seed, **same, screen=True)
    if rec is not None and reach(rec["curve"][1:], rec["target"], hold_of(rec)) is None \
            and rec.get("max_steps") != max_steps:
        return None
    return rec


def why_of(rows: list[dict]) -> dict[str, float]:
    """``WHY``'s per-step means and ``RUNNING``'s increase a step (from 0 before the first
    step) over the step rows of a run's metrics (row 0 is the start), and the drafter's
    acceptance where it proposed any token."""
    steps = rows[1:]
    out = {k: statistics.fmean(r[k] for r in steps if k in r) for k in WHY
           if any(k in r for r in steps)}
    total = {}
    for k in RUNNING:
        seen = [r for r in steps if k in r]
        if seen:
            total[k] = seen[-1][k]
            out[k + " a step"] = total[k] / len(seen)
    if total.get("draft/tokens_proposed"):
        out["draft/acceptance"] = total["draft/tokens_accepted"] / total["draft/tokens_proposed"]
    return out


def seed_mean(curves: list[list]) -> list[tuple]:
    """At each evaluation index every seed has: mean step, training seconds, accuracy, tokens."""
    n = min(len(c) for c in curves)
    return [tuple(statistics.fmean(c[i][j] for c in curves) if curves[0][i][j] is not None
                  else None for j in range(4)) for i in range(n)]


def reach(curve: list[tuple], target: float, hold: int = 1) -> tuple | None:
    """The first evaluation at or over ``target`` that the next ``hold - 1`` evaluations
    also are (``hold`` 2: reached at two evaluations in a row, so one noisy evaluation
    does not count), or None. Its own time is the time to the target."""
    for i, p in enumerate(curve):
        if len(curve) - i >= hold and all(q[2] >= target for q in curve[i:i + hold]):
            return p
    return None


def hold_of(record: dict) -> int:
    """A results row's ``hold`` (rows recorded before it existed: 1)."""
    return record.get("hold", 1)


def summary(runs: list[dict], target: float) -> dict:
    """Over a row's seeds: time and tokens to ``target`` on the seed-mean curve when every
    seed was evaluated at the same steps; under the full protocol (each seed stops at its own
    cap, so the last evaluation's step differs), on the seed-mean curve of the evaluations
    every seed has; when a row stopped at the target (the screen and --quick), or when that
    shared curve is too short to reach it (a seed stopped early) while every seed reached it
    alone, the mean of the seeds' own times to it (``reading`` says which)."""
    curves = [r["curve"] for r in runs]
    hold = hold_of(runs[0])  # one per table (`pick`)
    seeds_hits = [reach(c[1:], target, hold) for c in curves]
    common = set.intersection(*({p[0] for p in c} for c in curves))
    at_target = any(r.get("screen") or r.get("quick") for r in runs)
    hit, reading = None, "seed-mean curve"
    if all([p[0] for p in c] == [p[0] for p in curves[0]] for c in curves):
        hit = reach(seed_mean(curves)[1:], target, hold)
    elif not at_target:
        hit = reach(seed_mean([[p for p in c if p[0] in common] for c in curves])[1:], target,
                    hold)
    own = (statistics.fmean(h[1] for h in seeds_hits) if all(seeds_hits) else None)
    # a seed that never reached the target ran to its cap without it: its own time is more
    # than its last evaluation's, so this mean is a floor under the mean of the own times
    floor = statistics.fmean(h[1] if h else c[-1][1] for h, c in zip(seeds_hits, curves))
    if hit is None and all(seeds_hits):
        hit = tuple(statistics.fmean(h[j] for h in seeds_hits) if seeds_hits[0][j] is not None
                    else None for j in range(4))
        reading = "mean of the seeds' times"
    finals = [r["curve"][-1][2] for r in runs]
    return {"seeds": len(runs), "time_s": hit[1] if hit else None, "reading": reading,
            "own_time_s": own, "own_floor_s": floor,
            "tokens": hit[3] if hit else None,
            "cap_s": max(r["curve"][-1][1] for r in runs),
            "seeds_reaching": sum(h is not None for h in seeds_hits),
            "seed_times": [h[1] if h else None for h in seeds_hits],
            "final": statistics.fmean(finals),
            "final_std": statistics.stdev(finals) if len(finals) > 1 else 0.0,
            "split": {k: statistics.fmean(r["split"][k] for r in runs)
                      for k in runs[0]["split"]},
            "why": {k: statistics.fmean(r["why"].get(k, 0.0) for r in runs)
                    for k in runs[0]["why"]}}


def sooner(a: dict, b: dict) -> str:
    """How many times sooner a reaches the target than b; a bound where b never does. Two
    rows read differently (one on its seed-mean curve, one as the mean of its seeds' times)
    are both compared on the mean of their seeds' own times. Where b's seed-mean curve never
    reaches it over several seeds (each stopped at its own cap), the bound is on the seeds'
    own means too: b's seeds that never reached it count at their caps (a floor), against
    the mean of a's seeds' own times."""
    if a.get("reading", "") != b.get("reading", "") and a["own_time_s"] and b["own_time_s"]:
        return f"x{b['own_time_s'] / a['own_time_s']:.2f}"
    if a["time_s"] is None:
        return "not reached"
    if b["time_s"] is None:  # b's seeds that never reached it count at their caps: a floor
        if a.get("seeds", 1) > 1 and b.get("seeds", 1) > 1 and a["own_time_s"]:
            return f"x>{b['own_floor_s'] / a['own_time_s']:.2f}"  # on the seeds' own means
        return f"x>{b['cap_s'] / a['time_s']:.2f}"
    return f"x{b['time_s'] / a['time_s']:.2f}"


# rows measured against another reference than sync: the methods that draft from a prompt's
# earlier responses, on a train pool small enough for prompts to come back, against sync GRPO
# on that same pool
REFERENCE = {"spec_rl_pool": "sync_pool", "das_pool": "sync_pool"}


def time_cell(x: dict) -> str:
    """A summary's time to the target: the seed-mean curve's (``*``: the mean of the seeds'
    own times), or that it was not reached (by the cap, with one seed); with several seeds,
    each seed's own time after it ("-": not reached by that seed's cap) and their mean."""
    if x["time_s"] is not None:
        t = f"{x['time_s']:.0f}" + (" *" if x["reading"] != "seed-mean curve" and x["seeds"] > 1
                                    else "")
    else:
        t = "not reached" if x["seeds"] > 1 else f"not by {x['cap_s']:.0f}"
    if x["seeds"] > 1:
        t += " (" + ", ".join("-" if v is None else f"{v:.0f}" for v in x["seed_times"])
        if x["own_time_s"] is not None and x["reading"] == "seed-mean curve":
            t += f"; mean {x['own_time_s']:.0f}"  # what a row read the other way is set against
        t += ")"
    return t


def summaries(results: list[dict], target: float) -> dict[str, dict]:
    """Each row's `summary` over its seeds, in the order the rows first appear."""
    by: dict[str, list[dict]] = {}
    for r in results:
        by.setdefault(r["row"], []).append(r)
    return {name: summary(rs, target) for name, rs in by.items()}


def table(results: list[dict], target: float) -> str:
    s = summaries(results, target)
    lines = [f"| row | seeds | to {target:.0%} (s) | tokens to it | seeds reaching | final "
             "(± std) | step s (gen / train / wait) | vs sync | why | paper's headline |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, x in s.items():
        sp = x["split"]
        split = f"{sp.get('time/step_s', 0):.1f}"
        if "time/generate_s" in sp:
            split += (f" ({sp['time/generate_s']:.1f} / {sp.get('time/train_s', 0):.1f} / "
                      f"{sp.get('time/wait_for_rollouts_s', 0):.1f})")
        why = ", ".join(f"{k} {v:.3g}" for k, v in x["why"].items())
        t = time_cell(x)
        tok = f"{x['tokens']:.0f}" if x["tokens"] is not None else "-"
        ref = REFERENCE.get(name, "sync")
        vs = sooner(x, s[ref]) if ref in s and name != ref else ""
        if vs and ref != "sync":
            vs += f" (vs {ref})"
        lines.append(f"| {name} | {x['seeds']} | {t} | {tok} | {x['seeds_reaching']} | "
                     f"{x['final']:.3f} ± {x['final_std']:.3f} | {split} | {vs} | {why} | "
                     f"{PAPER.get(name, '')} |")
    if any(x["time_s"] is not None and x["reading"] != "seed-mean curve" and x["seeds"] > 1
           for x in s.values()):
        lines.append("\n\\* the seed-mean curve of the evaluations every seed has never reached "
                     "the target: the mean of the seeds' own times (and a row compared with "
                     "it is compared on its own seeds' mean too)")
    return "\n".join(lines)


# README's two tournament tables, each between its markers: the screen's (every row stops at
# the evaluation that reaches the target) and the full protocol's (every row runs on to twice
# sync's time in its seed), with the command that writes it
README_COMMANDS = {"screen": "python benchmarks/tournament.py --table --screen --readme",
                   "full": "python benchmarks/tournament.py --table --readme"}
README_BLOCKS = {
    "screen": (f"<!-- tournament table: {README_COMMANDS['screen']} -->",
               "<!-- end of tournament table -->"),
    "full": (f"<!-- tournament table, full protocol: {README_COMMANDS['full']} -->",
             "<!-- end of tournament table, full protocol -->"),
}
README_START, README_END = README_BLOCKS["screen"]


def protocol_of(record: dict) -> str:
    """A results row's protocol: "quick" (`--quick`), "screen" (`--screen`), or "full"."""
    return "quick" if record.get("quick") else "screen" if record.get("screen") else "full"


def pick(results: list[dict], *, protocol: str, cap: float, commit: str | None = None,
         target: float | None = None, hold: int | None = None) -> list[dict]:
    """The rows one table compares: of ``protocol`` and ``cap`` (a row recorded before rows
    carried their cap ran at its protocol's default: 1.5 quick, else 2), of ``commit`` and
    ``target`` and ``hold`` where given, and then of the last such row's commit, machine, start
    checkpoint, target, evaluation overrides and ``hold``. Rows of two protocols never share a table:
    a screen run stops at the target, a full one runs on to its cap, and their finals mean
    different things; but under the full protocol at cap 1 a screen sync run stands for the
    full protocol's (both stop at the evaluation that reaches the target), as
    `capping_sync` lets it cap the seed's rows."""
    def fits(r: dict) -> bool:
        if protocol == "full" and cap == 1.0 and r["row"] == "sync" and \
                protocol_of(r) == "screen":
            return True
        own = r.get("cap", 1.5 if protocol_of(r) == "quick" else 2.0)
        return protocol_of(r) == protocol and own == cap

    mine = [r for r in results if fits(r) and (commit is None or r["commit"] == commit)
            and (target is None or r.get("target") == target)
            and (hold is None or hold_of(r) == hold)]
    if not mine:
        return []
    last = mine[-1]
    same = ("commit", "machine", "init", "target", "extra", "hold")
    return [r for r in mine if all(_field(r, k) == _field(last, k) for k in same)]


def readme_table(results: list[dict], target: float, machine: str, commit: str,
                 protocol: str = "screen") -> str:
    """The compact table README shows: per row its seeds, time to ``target`` (and each
    seed's), how many seeds reach it, final accuracy ± std, step time, and how many times
    sooner than sync and than TRL (where those rows are in ``results``)."""
    s = summaries(results, target)
    hold = hold_of(results[0]) if results else 1
    held = f", reached at {hold} evaluations in a row" if hold > 1 else ""
    lines = [f"{machine}, commit `{commit}`, target {target:.0%} held-out greedy accuracy"
             f"{held} (generated by `{README_COMMANDS[protocol]}`):", "",
             f"| row | seeds | training s to {target:.0%} (each seed) | seeds reaching | "
             "final ± std | s a step | vs sync | vs TRL |", "|---|---|---|---|---|---|---|---|"]
    for name, x in s.items():
        t = time_cell(x)
        vs = [sooner(x, s[ref]) if ref in s and ref != name else "" for ref in ("sync", "trl")]
        lines.append(f"| {name} | {x['seeds']} | {t} | {x['seeds_reaching']}/{x['seeds']} | "
                     f"{x['final']:.1%} ± {x['final_std']:.1%} | "
                     f"{x['split'].get('time/step_s', 0):.1f} | {vs[0]} | {vs[1]} |")
    if any(x["time_s"] is not None and x["reading"] != "seed-mean curve" and x["seeds"] > 1
           for x in s.values()):
        lines += ["", "\\* the mean of the seeds' own times (the evaluations every seed has "
                  "never reach the target on their mean); a row compared with it is compared "
                  "on its seeds' mean too."]
    return "\n".join(lines)


def replace_block(text: str, block: str, protocol: str = "screen") -> str:
    """``text`` with what lies between ``protocol``'s markers (`README_BLOCKS`) replaced by
    ``block``; a ValueError when the markers are missing or out of order."""
    start, end = README_BLOCKS[protocol]
    i = text.find(start)
    j = text.find(end, i) if i >= 0 else -1
    if i < 0 or j < 0:
        raise ValueError(f"replace_block: the markers {start!r} and {end!r} are not both "
                         "there, in that order")
    return text[:i + len(start)] + "\n" + block + "\n" + text[j:]
