"""Fit the cost model from measured synchronous runs' metrics.jsonl (written with log_every = 1).

Per logged step a run records its wall time (``time``), time/wait_for_rollouts_s (the
trainer's wait: in a synchronous run, generation of the whole batch with its scoring and
admission), time/train_s, time/step_s, and the trained batch (pipeline/samples_in_batch,
length/mean, length/max). In a synchronous run every row of a step is admitted together, so
a step decodes length/max times with the batch's rows:

- generation: least squares of ``wait = decode_base_s * length_max + decode_row_s * tokens``
  over the steps of every run given (runs with different batches separate the two terms);
  prefill, scoring and per-sample Python are folded into decode_row_s (a fixed share of
  each sample at a fixed prompt length), and the context term is left 0 (not identifiable
  at short contexts);
- the trainer's side: least squares of ``wall time - wait = train_step_s + train_token_s *
  tokens`` (prompt + response): the update and the loop's own work per step (metrics,
  recording the rollouts, publishing the weights), which grows with the batch too; the
  weight update is inside it, so ``sync_s`` is 0.

Knows metrics rows and the cost model's fields, nothing else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from reroll.runlog import read_metrics


def _line(x: list[list[float]], y: list[float]) -> tuple[float, float]:
    """Non-negative least squares of y on two columns (one of them 0 if not identifiable)."""
    (a, b), *_ = np.linalg.lstsq(np.array(x), np.array(y), rcond=None)
    if a < 0 or b < 0:
        return 0.0, float(sum(y) / sum(r[1] for r in x))
    return float(a), float(b)


def fit(run_dirs: list[str | Path], *, prompt_tokens: int, skip: int = 1) -> dict[str, float]:
    """Cost-model fields (`reroll.sim.settings.SimSettings`) from synchronous runs' metrics;
    the first ``skip`` steps of each run (warm-up) are left out."""
    gen_x, gen_y, train_x, train_y = [], [], [], []
    for d in run_dirs:
        rows = [r for r in read_metrics(d) if "time/train_s" in r]
        for prev, r in list(zip(rows, rows[1:]))[max(0, skip - 1):]:
            n = r["pipeline/samples_in_batch"]
            gen_x.append([r["length/max"], n * r["length/mean"]])
            gen_y.append(r["time/wait_for_rollouts_s"])
            train_x.append([1.0, n * (prompt_tokens + r["length/mean"])])
            train_y.append(r["time"] - prev["time"] - r["time/wait_for_rollouts_s"])
    if not gen_y:
        raise ValueError(f"no consecutive step rows in the metrics of {run_dirs}")
    base, row = _line(gen_x, gen_y)
    step, token = _line(train_x, train_y)
    return {"decode_base_s": base, "decode_row_s": row, "decode_ctx_s": 0.0,
            "prefill_token_s": 0.0, "train_step_s": step,
            "train_token_s": token, "sync_s": 0.0, "prompt_tokens": prompt_tokens}
