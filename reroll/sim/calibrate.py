"""Fit the cost model from measured synchronous runs' metrics.jsonl (written with log_every = 1).

Per logged step a run records its wall time (``time``), time/wait_for_rollouts_s (the
trainer's wait: in a synchronous run, generation of the whole batch with its scoring and
admission), time/train_s, time/step_s, and the trained batch (pipeline/samples_in_batch,
length/mean, length/max). In a synchronous run every row of a step is admitted together, so
a step decodes length/max times with the batch's rows:

- generation: non-negative least squares of ``wait = decode_base_s * length_max +
  decode_row_s * tokens + row_s * samples`` over the steps of every run given (runs with
  different batches and different response lengths separate the three terms: a fixed
  response length alone would fold each batch's fixed costs into the per-decode-step
  one); prefill at the fixed prompt length, submission and scoring are row_s, and the
  context term is left 0 (not identifiable at short contexts);
- the trainer's side: non-negative least squares of ``time/train_s = train_step_s +
  train_token_s * tokens`` (prompt + response), the update itself;
- the rest of a step, ``wall time - wait - time/train_s``, is the loop's own work
  (recording the rollouts, metrics, fetching and publishing the weights): ``loop_s`` is its
  mean, time the trainer waits while generation goes on (`reroll.loop.run` records and
  logs while the rollout pipeline keeps generating). The weight swap itself
  (``sync_s``, a stop of both sides) is left 0: in a synchronous run it is part of the
  next wait, which the generation terms take.

A run with partial rollouts interrupts the rows running at each weight update and resumes
them, prefilling their prompt and prefix again; a synchronous run never does, so its fit
says nothing of that cost. `fit_resume` measures it on the engine's own busy time
(time/generate_s, its prefill and decode) of runs with and without resumes: non-negative
least squares of ``generate_s = a * tokens generated + b * samples started +
resume_row_s * requests resumed`` per step (the counters are cumulative, so per step is
the difference of two rows; a resume comes with the admission of new groups after an
update, whose own prefill the middle term takes).

On a shared machine a step now and then stalls for seconds (another process holds the
core); such steps (more than twice their run's median for the same work) are left out of
each term's fit: the mean-square fit would otherwise follow them.

Knows metrics rows and the cost model's fields, nothing else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from reroll.runlog import read_metrics


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
    """Cost-model fields (`reroll.sim.settings.SimSettings`) from synchronous runs' metrics;
    the first ``skip`` steps of each run (warm-up) are left out, and so is each term's
    stalled steps (`unstalled`)."""
    gen_x, gen_y, train_x, train_y, loop = [], [], [], [], []
    for d in run_dirs:
        rows = [r for r in read_metrics(d) if "time/train_s" in r]
        pairs = list(zip(rows, rows[1:]))[max(0, skip - 1):]
        waits = [r["time/wait_for_rollouts_s"] for _, r in pairs]
        trains = [r["time/train_s"] for _, r in pairs]
        loops = [r["time"] - p["time"] - w - t for (p, r), w, t in zip(pairs, waits, trains)]
        for (_, r), w, t, lp, kw, kt, kl in zip(pairs, waits, trains, loops, unstalled(waits),
                                               unstalled(trains), unstalled(loops)):
            n = r["pipeline/samples_in_batch"]
            if kw:
                gen_x.append([r["length/max"], n * r["length/mean"], n])
                gen_y.append(w)
            if kt:
                train_x.append([1.0, n * (prompt_tokens + r["length/mean"])])
                train_y.append(t)
            if kl:
                loop.append(lp)
    if not gen_y:
        raise ValueError(f"no consecutive step rows in the metrics of {run_dirs}")
    base, row, sample = nnls(gen_x, gen_y)
    step, token = nnls(train_x, train_y)
    return {"decode_base_s": base, "decode_row_s": row, "row_s": sample, "decode_ctx_s": 0.0,
            "prefill_token_s": 0.0, "train_step_s": step,
            "train_token_s": token, "loop_s": max(0.0, sum(loop) / len(loop)), "sync_s": 0.0,
            "prompt_tokens": prompt_tokens}


def fit_resume(run_dirs: list[str | Path], *, skip: int = 1) -> dict[str, float]:
    """``resume_row_s`` (engine time per resumed request, its prefill of prompt and prefix
    included), and for the report ``engine_token_s`` and ``engine_sample_s`` (engine time
    per generated token and per sample started) from runs' metrics, at least one with partial rollouts; refuses runs that resumed
    nothing."""
    x, y = [], []
    for d in run_dirs:
        rows = [r for r in read_metrics(d) if "time/generate_s" in r]
        for prev, r in list(zip(rows, rows[1:]))[max(0, skip - 1):]:
            size = r["pipeline/samples_in_batch"] / r["pipeline/groups_in_batch"]
            x.append([r["pipeline/tokens_generated"] - prev["pipeline/tokens_generated"],
                      size * (r["pipeline/started"] - prev["pipeline/started"]),
                      r.get("engine/requests_resumed", 0) - prev.get("engine/requests_resumed",
                                                                        0)])
            y.append(r["time/generate_s"])
    if not any(res for *_, res in x):
        raise ValueError(f"no request was resumed in the runs {run_dirs}: fitting the resume "
                         f"cost needs one with partial rollouts and max_staleness > 0")
    tok, start, res = nnls(x, y)
    return {"resume_row_s": res, "engine_token_s": tok, "engine_sample_s": start}
