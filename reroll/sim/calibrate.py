"""Fit the cost model from a measured run's metrics.jsonl (written with log_every = 1).

Per logged step the run records time/generate_s (the engine's prefill + decode time),
time/train_s, the trained batch (pipeline/samples_in_batch, length/mean, length/max) and the
cumulative pipeline/tokens_generated. In a synchronous run every row of a step is admitted
together, so a step decodes length/max times with the batch's rows: the fit is the least
squares of ``generate_s = decode_base_s * length_max + decode_row_s * tokens``, over the
steps of every run given (runs with different batches separate the two), and
``train_token_s`` = train_s / (samples x (prompt + mean response)). Prefill is folded into
decode_row_s (it is a fixed share of each sample's cost at a fixed prompt length) and the
context term is left 0 (not identifiable at this run's short contexts); ``sync_s`` is what
a synchronous step takes beyond waiting and training, less the generation time. Knows
metrics rows and the cost model's fields, nothing else.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from reroll.runlog import read_metrics


def fit(run_dirs: list[str | Path], *, prompt_tokens: int, skip: int = 1) -> dict[str, float]:
    """Cost-model fields (`reroll.sim.settings.SimSettings`) from synchronous runs' metrics;
    the first ``skip`` steps of each run (warm-up) are left out."""
    a, y, train, overhead = [], [], [], []
    for d in run_dirs:
        rows = [r for r in read_metrics(d) if "time/generate_s" in r][skip:]
        for r in rows:
            n = r["pipeline/samples_in_batch"]
            a.append([r["length/max"], n * r["length/mean"]])
            y.append(r["time/generate_s"])
            train.append(r["time/train_s"] / (n * (prompt_tokens + r["length/mean"])))
            overhead.append(max(0.0, r["time/wait_for_rollouts_s"] - r["time/generate_s"]))
    if not y:
        raise ValueError(f"no step rows with time/generate_s in {run_dirs}")
    (base, row), *_ = np.linalg.lstsq(np.array(a), np.array(y), rcond=None)
    if base < 0 or row < 0:  # one of them is not identifiable: all of it per token
        base, row = 0.0, float(sum(y) / sum(x[1] for x in a))
    return {"decode_base_s": float(base), "decode_row_s": float(row), "decode_ctx_s": 0.0,
            "prefill_token_s": 0.0, "train_token_s": float(np.median(train)),
            "train_step_s": 0.0, "sync_s": float(np.median(overhead)),
            "prompt_tokens": prompt_tokens}
