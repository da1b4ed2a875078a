"""Fit the cost model from measured synchronous runs' metrics.jsonl (written with log_every = 1).

Per logged step a run records its wall time (``time``), time/wait_for_rollouts_s (the
trainer's wait: in a synchronous run, generation of the whole batch with its scoring and
admission), time/train_s, time/step_s, and the trained batch (pipeline/samples_in_batch,
length/mean, length/max). In a synchronous run every row of a step is admitted together, so
a step decodes length/max times with the batch's rows:

- generation: non-negative least squares of ``wait = sync_s + decode_base_s * length_max
  + decode_row_s * tokens + row_s * samples`` over the steps of every run given (runs with
  different batches and different response lengths separate the four terms, with at least
  three (longest response, batch size) points not on one line, else the fit refuses: a fixed
  response length alone would fold each batch's fixed costs into the per-decode-step
  one). ``sync_s`` is what an update costs whatever the batch (the weights sent and
  loaded, the next batch's admission begun): the wait starts when the loop publishes, so
  the swap is inside it; without the term the fit spread it over the samples and decode
  steps and put a decoded token far below the engine's own time (3.5 against 26.5 us on
  the main job). Prefill at the fixed prompt length, submission and scoring are row_s, and the
  context term is left 0 (not identifiable at short contexts); with runs of several tasks
  (`fit_tasks`) each task has a ``decode_row_s`` of its own;
- the trainer's side: non-negative least squares of ``time/train_s = train_step_s +
  train_token_s * tokens`` (prompt + response), the update itself;
- the rest of a step, ``wall time - wait - time/train_s``, is the loop's own work
  (recording the rollouts, metrics, fetching and publishing the weights): non-negative
  least squares of ``loop_s + loop_row_s * samples``, time the trainer waits while
  generation goes on (`reroll.loop.run` records and logs while the rollout pipeline keeps
  generating; recording grows with the batch).

A run with partial rollouts interrupts the rows running at each weight update and resumes
them, prefilling their prompt and prefix again; a synchronous run never does, so its fit
says nothing of that cost. `fit_resume` measures the engine's share on its own busy time
(time/generate_s, its prefill and decode): non-negative least squares of ``generate_s =
a * tokens generated + b * samples started + c * tokens resumed + d * requests resumed``
per step (the counters are cumulative, so per step is the difference of two rows; a
resume comes with the admission of new groups after an update, whose own prefill the
second term takes). Those terms are a resume's cost to the engine; the driver's abort and
re-add of each request, which stop the engine and the trainer, come from the runs'
timelines (`calibrate_timeline.update_stop`). For runs recorded without a timeline, `fit_resume_wall` takes
the whole resume cost from wall time instead (the driver aborts, copies and re-adds each
request on the engine's core, and the engine waits for it): what the simulator misses, a step, on runs that resume, against their
resumed tokens and requests, the per-token term fixed at the engine's own prefill time
per resumed token (well determined: every step of every run) and the per-request term
fitted over the runs (two runs would only solve for both terms). Resumed tokens a step are the engine's
``engine/resumed_tokens`` where a run logged it, else estimated from its recorded
rollouts (`resumed_tokens`).

On a shared machine a step now and then stalls for seconds (another process holds the
core); such steps (more than twice their run's median for the same work) are left out of
each term's fit: the mean-square fit would otherwise follow them. The time they took beyond
their run's median is not dropped: ``stall_s`` is its total over the runs' steps, a mean
cost per step (the measured throughput counts the stalled steps, so the model must too).

What the runs' timelines give (the loop's share of the core it shares with the engine, an
update's abort and re-add) is in `reroll.sim.calibrate_timeline`.

Knows metrics rows, recorded rollouts' spans and the cost model's fields, nothing else (the simulated times `fit_resume_wall` takes come from its caller).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from reroll.runlog import read_metrics, read_rollouts


def nnls(x: list[list[float]], y: list[float]) -> list[float]:
    """Non-negative least squares of y on the columns of x, exactly, by trying every subset
    of columns (a handful here): the unconstrained fit on the subset with the smallest
    squared error whose coefficients are all >= 0, the others 0."""
    X, Y = np.array(x, dtype=float), np.array(y, dtype=float)
    k = X.shape[1]
    best: tuple[float, list[float]] = (float(Y @ Y), [0.0] * k)
    for mask in range(1, 2 ** k):
        cols = [j for j in range(k) if mask >> j & 1]
        c, *_ = np.linalg.lstsq(X[:, cols], Y, rcond=None)
        if (c < -1e-15).any():
            continue
        coef = [0.0] * k
        for j, v in zip(cols, c):
            coef[j] = max(0.0, float(v))
        err = float(((X @ np.array(coef) - Y) ** 2).sum())
        if err < best[0] - 1e-18:
            best = (err, coef)
    return best[1]


def unstalled(ys: list[float], factor: float = 2.0) -> list[bool]:
    """Which of one run's measurements of the same work to keep: those at most ``factor``
    times the run's median (a step that took longer was stalled by other work on the
    machine, which the cost model does not describe)."""
    m = float(np.median(ys)) if ys else 0.0
    return [y <= factor * m for y in ys]


def fit(run_dirs: list[str | Path], *, prompt_tokens: int, skip: int = 1) -> dict[str, float]:
    """Cost-model fields (`reroll.sim.settings.SimSettings`) from synchronous runs' metrics
    of one task; the first ``skip`` steps of each run (warm-up) are left out, and so is each
    term's stalled steps (`unstalled`)."""
    return fit_tasks(run_dirs, [""] * len(run_dirs), prompt_tokens=prompt_tokens,
                     skip=skip)[""]


def fit_tasks(run_dirs: list[str | Path], tasks: list[str], *, prompt_tokens: int,
              skip: int = 1, token_s: float | None = None) -> dict[str, dict[str, float]]:
    """One cost model per task (``tasks[i]`` is run ``i``'s), fitted together: every term is
    shared but ``decode_row_s``, the cost of a decoded token, which each task other than
    ``tasks[0]`` (the reference) may raise by a term of its own (a generation column of its
    tokens, zero on the other tasks' steps; non-negative, as the rest). The engine's
    measured time a token differs between tasks on one model (on the long-tail task 40% over
    the main job's at the same batch), and a shared term splits the difference, too slow on
    one task and too fast on the other. A task with one calibration run has its term solved
    from that run's residual: it predicts that task at other lengths and schedules.

    ``token_s``: the reference task's cost a decoded token is fixed at it (the engine's own,
    `fit_engine`) and the other generation terms are fitted on the rest of the wait. The
    synchronous runs alone hardly tell a token's cost from a decode step's and an update's
    (the Xeon's runs of one session put a token at 10.5 us, those of the next at 1.9 us,
    both fitting every run's wait within 3%), and the prediction of other lengths moves
    with the split."""
    if not run_dirs or len(tasks) != len(run_dirs):
        raise ValueError(f"fit_tasks: {len(run_dirs)} runs and {len(tasks)} task labels: "
                         "one label a run, at least one run")
    others = list(dict.fromkeys(t for t in tasks if t != tasks[0]))
    gen_x, gen_y, train_x, train_y, loop_x, loop_y = [], [], [], [], [], []
    stalled, steps = 0.0, 0
    for d, task in zip(run_dirs, tasks):
        rows = [r for r in read_metrics(d) if "time/train_s" in r]
        pairs = list(zip(rows, rows[1:]))[max(0, skip - 1):]
        waits = [r["time/wait_for_rollouts_s"] for _, r in pairs]
        trains = [r["time/train_s"] for _, r in pairs]
        loops = [r["time"] - p["time"] - w - t for (p, r), w, t in zip(pairs, waits, trains)]
        stalled += stall_excess(waits) + stall_excess(trains) + stall_excess(loops)
        steps += len(pairs)
        for (_, r), w, t, lp, kw, kt, kl in zip(pairs, waits, trains, loops, unstalled(waits),
                                               unstalled(trains), unstalled(loops)):
            n = r["pipeline/samples_in_batch"]
            if kw:
                tokens = n * r["length/mean"]
                gen_x.append([1.0, r["length/max"], tokens, n,
                              *[tokens if task == t else 0.0 for t in others]])
                gen_y.append(w)
            if kt:
                train_x.append([1.0, n * (prompt_tokens + r["length/mean"])])
                train_y.append(t)
            if kl:
                loop_x.append([1.0, n])
                loop_y.append(lp)
    if not gen_y:
        raise ValueError(f"no consecutive step rows in the metrics of {run_dirs}")
    if np.linalg.matrix_rank(np.asarray(gen_x)) < len(gen_x[0]):
        # e.g. runs of one response length and two batch sizes: an update's fixed cost and a
        # decode step's are then one column, and the fit would hand it all to either
        raise ValueError(
            f"fit: the runs {[str(d) for d in run_dirs]} do not separate the generation "
            "terms (an update's fixed cost, a decode step's, a token's, a sample's, and each "
            "task's token): they need at least three (longest response, batch size) points "
            "not on one line, and a second response length or batch size for every task")
    if token_s is None:
        sync, base, row, sample, *extra = nnls(gen_x, gen_y)
    else:  # the token column's share taken out of the wait, the column left out
        sync, base, sample, *extra = nnls([[*x[:2], *x[3:]] for x in gen_x],
                                          [y - token_s * x[2] for x, y in zip(gen_x, gen_y)])
        row = token_s
    step, token = nnls(train_x, train_y)
    loop, loop_row = nnls(loop_x, loop_y)
    shared = {"decode_base_s": base, "row_s": sample, "decode_ctx_s": 0.0,
              "prefill_token_s": 0.0, "train_step_s": step, "train_token_s": token,
              "loop_s": loop, "loop_row_s": loop_row, "stall_s": stalled / steps,
              "sync_s": sync, "prompt_tokens": prompt_tokens}
    return {t: {**shared, "decode_row_s": row + e}
            for t, e in zip([tasks[0], *others], [0.0, *extra])}


def fit_engine(run_dirs: list[str | Path], *, skip: int = 1) -> dict[str, float]:
    """The engine's own cost a decode step, a decoded token and an admitted sample, from
    synchronous runs' ``time/generate_s`` (its busy time: prefill and decode, not the
    driver's calls around them): non-negative least squares of ``generate_s = step *
    length/max + token * tokens + sample * samples`` over the steps after ``skip``, stalled
    ones (`unstalled`) left out. Synchronous runs only: every row of a step is admitted at
    once, so the step decodes length/max times. On the Xeon two sessions' runs gave 1.78
    and 1.72 ms a step, 10.9 and 12.0 us a token (the wait's own fit: 1.9 and 10.5)."""
    x, y = [], []
    for d in run_dirs:
        rows = [r for r in read_metrics(d) if "time/generate_s" in r and "time/train_s" in r]
        rows = rows[skip:]
        gens = [r["time/generate_s"] for r in rows]
        for r, keep in zip(rows, unstalled(gens)):
            if keep:
                n = r["pipeline/samples_in_batch"]
                x.append([r["length/max"], n * r["length/mean"], n])
                y.append(r["time/generate_s"])
    if not y:
        raise ValueError(f"fit_engine: no step with time/generate_s in {run_dirs}")
    step, token, sample = nnls(x, y)
    return {"engine_step_s": step, "engine_token_s": token, "engine_sample_s": sample}


def stall_excess(ys: list[float], factor: float = 2.0) -> float:
    """The time one run's stalled measurements (`unstalled`) took beyond the run's median:
    what the steps left out of a term's fit lost to the stall."""
    m = float(np.median(ys)) if ys else 0.0
    return sum(y - m for y, keep in zip(ys, unstalled(ys, factor)) if not keep)


def resumed_tokens(run_dir: str | Path) -> list[float]:
    """Prompt and prefix tokens the run's resumes prefilled again, cumulative, one value per
    metrics row that has ``time/generate_s``: ``engine/resumed_tokens`` where the run logged
    it, else ``engine/requests_resumed`` times the mean resumed prefix of the run's recorded
    rollouts (a sampled span after a sample's first starts where a resume prefilled again:
    its start is that resume's prompt and prefix)."""
    rows = [r for r in read_metrics(run_dir) if "time/generate_s" in r]
    if rows and all("engine/resumed_tokens" in r for r in rows):
        return [float(r["engine/resumed_tokens"]) for r in rows]
    starts = [s["start"] for _, g in read_rollouts(run_dir) for r in g["rollouts"]
              for s in [x for x in r["spans"] if x["source"] != "prompt"][1:]]
    mean = sum(starts) / len(starts) if starts else 0.0
    return [mean * r.get("engine/requests_resumed", 0.0) for r in rows]


def resumes_by_age(run_dir: str | Path) -> dict[int, dict[int, int]]:
    """Requests each weight update resumed, by age, from the recorded rollouts' spans:
    ``{version: {age: count}}``. A sampled span after a sample's first began where the
    update to its ``version`` resumed it; its age is that version less the group's start
    version (1: admitted at the update before). Only recorded (trained) samples count: an
    update's count is whole once every sample it resumed has been trained. A run with
    partial rollouts only: without them a span also begins where the engine loaded new
    weights in the middle of a response, which resumed nothing."""
    out: dict[int, dict[int, int]] = {}
    for _, g in read_rollouts(run_dir):
        for r in g["rollouts"]:
            for s in [x for x in r["spans"] if x["source"] != "prompt"][1:]:
                h, age = out.setdefault(s["version"], {}), s["version"] - g["start_version"]
                h[age] = h.get(age, 0) + 1
    return out


def in_engine(run_dir: str | Path) -> dict[int, dict[str, dict[int, int]]]:
    """Requests in the engine at each weight update, running (in a slot) or waiting for
    one, by age, from the recorded rollouts' spans: ``{version: {"running": {age: n},
    "waiting": {age: n}}}``. A sample of a group started before ``version`` that sampled
    under ``version`` or later was in the engine at that update; it was running if it also
    sampled under ``version - 1`` (a placed request keeps its slot until it finishes or an
    update aborts it), else waiting. Only recorded (trained) samples count
    (`resumes_by_age`)."""
    out: dict[int, dict[str, dict[int, int]]] = {}
    for _, g in read_rollouts(run_dir):
        for r in g["rollouts"]:
            vs = {x["version"] for x in r["spans"] if x["source"] != "prompt"}
            for v in range(g["start_version"] + 1, max(vs, default=-1) + 1):
                h = out.setdefault(v, {"running": {}, "waiting": {}})
                h = h["running" if v - 1 in vs else "waiting"]
                h[v - g["start_version"]] = h.get(v - g["start_version"], 0) + 1
    return out


def readds(run_dir: str | Path) -> dict[int, dict[str, float]]:
    """How each weight update's resumed requests went back into the engine, from the
    recorded timings (a sample keeps its last ``engine_add`` and ``engine_prefill``):
    ``{version: {"groups", "add_span_s", "place_after_s"}}``. The driver re-adds the
    aborted requests a group at a time (`reroll.runtime.ray.RayEnginePool.add`: one call
    to the engine each), all of them before the engine's next step
    (`reroll.engine.service.EngineService._add_submitted`): ``add_span_s`` is the first
    group's re-add to the last's, ``place_after_s`` the last re-add to the first
    placement (negative: the engine placed a request before the driver was done). Only
    the requests whose last resume was that update count (one resumed again later carries
    the later update's times), and a group's re-add is its earliest member's. A run with
    partial rollouts only (`resumes_by_age`)."""
    adds: dict[int, dict[str, float]] = {}
    placed: dict[int, float] = {}
    for _, g in read_rollouts(run_dir):
        for r in g["rollouts"]:
            spans = [x for x in r["spans"] if x["source"] != "prompt"]
            if len(spans) < 2:
                continue
            v, t = spans[-1]["version"], r["timings"]
            a = adds.setdefault(v, {})
            a[g["group_id"]] = min(a.get(g["group_id"], t["engine_add"]), t["engine_add"])
            placed[v] = min(placed.get(v, t["engine_prefill"]), t["engine_prefill"])
    return {v: {"groups": len(a), "add_span_s": max(a.values()) - min(a.values()),
                "place_after_s": placed[v] - max(a.values())} for v, a in sorted(adds.items())}


def readd_row_s(run_dir: str | Path, updates: tuple[int, int]) -> list[float]:
    """The driver's re-add time per request in the engine (``update_row_s``), at each
    update of ``updates`` (first, last) whose re-adds span two groups or more: `readds`'
    span (first group's re-add to the last's: all groups but the last) scaled to every
    group, over the requests in the engine then (`in_engine`), which it all re-adds."""
    adds, there = readds(run_dir), in_engine(run_dir)
    out = []
    for v in range(updates[0], updates[1] + 1):
        if v in adds and v in there and adds[v]["groups"] > 1:
            g, n = adds[v]["groups"], sum(sum(h.values()) for h in there[v].values())
            out.append(adds[v]["add_span_s"] * g / (g - 1) / n)
    return out


def fit_resume(run_dirs: list[str | Path], *, skip: int = 1) -> dict[str, float]:
    """The engine's own time per resumed request and per resumed token
    (``engine_resume_row_s``, ``engine_resume_token_s``: its prefill of prompt and prefix),
    per generated token and per sample started (``engine_token_s``, ``engine_sample_s``),
    from runs' metrics, at least one with partial rollouts; refuses runs that resumed
    nothing. Requests and tokens separate only where resumed prefixes differ in length
    between runs; otherwise the per-token term takes it (the first column)."""
    x, y = [], []
    for d in run_dirs:
        rows = [r for r in read_metrics(d) if "time/generate_s" in r]
        toks = resumed_tokens(d)
        pairs = list(zip(rows, rows[1:], toks, toks[1:]))[max(0, skip - 1):]
        for prev, r, t0, t1 in pairs:
            size = r["pipeline/samples_in_batch"] / r["pipeline/groups_in_batch"]
            x.append([r["pipeline/tokens_generated"] - prev["pipeline/tokens_generated"],
                      size * (r["pipeline/started"] - prev["pipeline/started"]), t1 - t0,
                      r.get("engine/requests_resumed", 0) - prev.get("engine/requests_resumed",
                                                                        0)])
            y.append(r["time/generate_s"])
    if not any(x_[3] for x_ in x):
        raise ValueError(f"no request was resumed in the runs {run_dirs}: fitting the resume "
                         f"cost needs one with partial rollouts and max_staleness > 0")
    tok, start, res_tok, res = nnls(x, y)
    return {"engine_resume_row_s": res, "engine_resume_token_s": res_tok,
            "engine_token_s": tok, "engine_sample_s": start}


def fit_resume_wall(runs: list[dict[str, float]], *, token_s: float | None = None,
                    update: bool = False) -> dict[str, float]:
    """``resume_token_s`` and ``resume_row_s`` in wall time, from runs with partial rollouts
    that the generation side holds back: for each, ``measured_s`` (its time a step),
    ``simulated_s`` (the simulator's, on the same cost model with both resume costs 0),
    ``resumed`` and ``resumed_tokens`` (measured, a step). Non-negative least squares of
    ``measured_s - simulated_s = resume_token_s * resumed_tokens + resume_row_s * resumed``:
    whatever a resume costs the generation side, on the engine (its prefill) or beside it
    (the driver aborting, copying and re-adding the request, on the engine's core), and
    whatever else the model misses on those runs.

    ``token_s`` (the engine's own prefill time per resumed token, ``engine_resume_token_s``
    of `fit_resume`, fitted on every step of every run) fixes the per-token term, and only
    ``resume_row_s`` is fitted, one unknown over the runs: the time a resume costs beside
    the engine is the driver's work per request, which does not grow with the prefix.
    Without it both terms are fitted, which two runs only solve (any noise in either run
    moves both terms; see benchmarks/docs/sim.md), and with one prefix length the two
    columns are proportional and the per-token term takes it all.

    ``update`` (with ``token_s``): ``update_s`` too, a fixed cost of each update (one a
    step) beside the one a request: ``measured_s - simulated_s - token_s * resumed_tokens =
    resume_row_s * resumed + update_s``. Runs that resume about as many requests a step
    cannot tell the two apart (every fit of theirs is a line through both), so the runs'
    resumes a step must differ by half or more (max_staleness 1 and 2 resume about 60 and
    140 a step on the main job); else the fit refuses."""
    if not any(r["resumed"] for r in runs):
        raise ValueError("fit_resume_wall: no run resumed a request")
    if update:
        if token_s is None:
            raise ValueError("fit_resume_wall: update=True needs token_s (three terms over "
                             "a few runs are not determined)")
        per = sorted(r["resumed"] for r in runs)
        if len(runs) < 2 or per[-1] < 1.5 * per[0]:
            raise ValueError(
                f"fit_resume_wall: the runs resume {', '.join(f'{x:.1f}' for x in per)} "
                f"requests a step; a request's cost and an update's need runs that differ "
                f"by half or more (e.g. max_staleness 1 and 2)")
    if token_s is not None:
        if token_s < 0:
            raise ValueError(f"fit_resume_wall: token_s must be >= 0, got {token_s}")
        left = [r["measured_s"] - r["simulated_s"] - token_s * r["resumed_tokens"]
                for r in runs]
        if update:
            row, fixed = nnls([[r["resumed"], 1.0] for r in runs], left)
            return {"resume_token_s": token_s, "resume_row_s": row, "update_s": fixed}
        (row,) = nnls([[r["resumed"]] for r in runs], left)
        return {"resume_token_s": token_s, "resume_row_s": row}
    tok, row = nnls([[r["resumed_tokens"], r["resumed"]] for r in runs],
                    [r["measured_s"] - r["simulated_s"] for r in runs])
    return {"resume_token_s": tok, "resume_row_s": row}
