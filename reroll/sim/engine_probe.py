"""The engine's own prefill cost, timed on the engine itself rather than fitted from runs.

A request resumed after a weight update prefills its prompt and prefix again. The runs'
metrics tell that cost apart from a request's fixed cost only when their resumed prefixes
differ in length, and the two asynchronous calibration runs of the main job resume with
about the same prefix (10.5 tokens): fitted from their steps (`calibrate.fit_resume`), the
per-token term moved from 0 to 27 us between run sets of one machine. Here the engine
prefills batches of requests whose lengths and counts vary independently, alone, in this
process, and the three terms come from the timings by non-negative least squares
(`fit_prefill`).

Knows a `TorchEngine` and the clock (`probe_run`: a run directory's starting model and
config too); the fit is a pure function.
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from reroll.sim.calibrate import nnls

# (requests, prompt tokens each): counts and lengths that vary apart, every batch within
# one packed prefill (at most 1,024 tokens) and one engine's slots
DESIGN = ((16, 8), (64, 8), (100, 8), (16, 16), (32, 16), (48, 20), (24, 32), (32, 30),
          (8, 40), (40, 24))


def fit_prefill(trials: list[tuple[int, int, float]]) -> dict[str, float]:
    """``prefill_forward_s``, ``prefill_token_s`` and ``prefill_row_s`` from trials
    ``(requests, tokens each, seconds)``: non-negative least squares of ``seconds =
    forward + token * requests * tokens + row * requests``. Needs counts and lengths that
    vary apart (three points not on one line), else refuses."""
    x = np.array([[1.0, k * n, k] for k, n, _ in trials])
    if len(trials) < 3 or np.linalg.matrix_rank(x) < 3:
        raise ValueError(f"fit_prefill: the trials {[(k, n) for k, n, _ in trials]} do not "
                         f"vary the requests and their length apart: three terms need three "
                         f"(requests, length) points not on one line")
    forward, token, row = nnls(x.tolist(), [s for _, _, s in trials])
    return {"prefill_forward_s": forward, "prefill_token_s": token, "prefill_row_s": row}


def probe_prefill(engine, *, design=DESIGN, repeats: int = 5, warmup: int = 3,
                  clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Time ``engine``'s prefill of each ``design`` batch (distinct random prompts, one
    token sampled each, so a batch is one packed prefill and its first token), ``repeats``
    times after ``warmup`` batches, and fit the median of each (`fit_prefill`). The
    engine must be empty; it is empty again after. Returns the fit and ``trials``."""
    import random

    from reroll.rollout import Rollout
    from reroll.sampling_params import SamplingParams

    if engine.pending():
        raise ValueError(f"probe_prefill: the engine has {engine.pending()} requests; "
                         f"it must be empty")
    vocab = engine.vocab
    rng = random.Random(0)
    serial = itertools.count()

    def batch(k: int, n: int) -> float:
        rs = []
        for _ in range(k):
            i = next(serial)
            rs.append(Rollout(prompt_id=f"probe{i}", group_id=f"probe{i}",
                              tokens=[rng.randrange(3, vocab) for _ in range(n)], prompt_len=n,
                              sampling=SamplingParams(max_new_tokens=1, seed=i)))
        engine.add(rs)
        t = clock()
        while engine.pending():
            engine.step()
        return clock() - t

    for _ in range(warmup):
        batch(*design[0])
    times: dict[tuple[int, int], list[float]] = {d: [] for d in design}
    for _ in range(repeats):  # interleaved: a slow spell touches every point alike
        for d in design:
            times[d].append(batch(*d))
    trials = [(k, n, statistics.median(times[(k, n)])) for k, n in design]
    return {**fit_prefill(trials), "trials": trials}


def probe_run(run_dir: str | Path, threads: int = 1) -> dict[str, float]:
    """`probe_prefill` on the engine a run builds (its ``config.toml``, its starting model
    in ``RUN/init``), with ``threads`` torch threads (a pinned engine actor has one: the
    runs' ``runtime.threads = 1``); the process's thread count is restored after."""
    import torch

    from reroll.build import build_engine, load_model
    from reroll.config_checks import load_checked

    run_dir = Path(run_dir)
    cfg = load_checked(str(run_dir / "config.toml"), [])
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model, tok = load_model(run_dir / "init", cfg)
        return probe_prefill(build_engine(model, tok, cfg))
    finally:
        torch.set_num_threads(before)
