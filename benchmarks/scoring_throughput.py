"""Scoring throughput: 10,000 math answers through the `math` verifier.

Measures (1) per-call latency of in-process scoring (the baseline: a plain loop calling the
Reward), then (2) ScoringPool throughput with workers = 0 (background thread), 1 and 2
(worker processes), each submitting every answer at once and waiting for all results.
Prints calls/s and the ratio to the in-process baseline measured in the same run.

    .venv/bin/python benchmarks/scoring_throughput.py [--n 10000] [--problems 1000]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time
from fractions import Fraction

from reroll.rollout import Example, Rollout
from reroll.verifiers import ScoringPool, build_reward
from reroll.verifiers.answers import _parse_gold


def make_data(n: int, problems: int, seed: int = 0) -> list[tuple[Rollout, Example]]:
    """n (rollout, example) pairs over `problems` distinct reference answers; answers mix
    boxed LaTeX fractions, decimals, "the answer is" phrases, right and wrong values."""
    rng = random.Random(seed)
    golds = []
    for i in range(problems):
        a, b = rng.randint(1, 99), rng.randint(2, 60)
        golds.append((f"p{i}", Fraction(a, b)))
    out = []
    for k in range(n):
        pid, g = golds[rng.randrange(problems)]
        v = g if rng.random() < 0.5 else g + Fraction(rng.randint(1, 9), rng.randint(2, 9))
        style = k % 4
        if style == 0:
            text = f"Working... so \\boxed{{\\frac{{{v.numerator}}}{{{v.denominator}}}}}"
        elif style == 1:
            text = f"The answer is {float(v):.6f}."
        elif style == 2:
            text = f"step 1: 3 + 4 = 7\nstep 2: {v.numerator}/{v.denominator}"
        else:
            text = f"<answer>{v.numerator}/{v.denominator}</answer>"
        gold = f"\\frac{{{g.numerator}}}{{{g.denominator}}}" if g.denominator != 1 else str(g)
        out.append((Rollout(pid, "g", [0], 0, completion=text), Example(pid, "q", gold)))
    return out


def in_process(data) -> tuple[float, list[float], float]:
    reward = build_reward([], {"name": "math"})
    reward.components[0].verifier.warmup()  # type: ignore[attr-defined]
    _parse_gold.cache_clear()  # every configuration starts with cold reference parses
    lat, correct = [], 0.0
    t0 = time.perf_counter()
    for r, ex in data:
        s = time.perf_counter()
        scores = reward(r, ex)
        lat.append(time.perf_counter() - s)
        correct += scores[0].value or 0.0
    return time.perf_counter() - t0, lat, correct / len(data)


def pooled(data, workers: int) -> tuple[float, dict, float]:
    pool = ScoringPool([], {"name": "math"}, workers=workers, timeout_s=30.0)
    if workers == 0:
        pool.reward.components[0].verifier.warmup()  # type: ignore[attr-defined]
    pool.submit(*data[0]).result()  # workers started and warm before timing
    _parse_gold.cache_clear()  # (workers=0 shares this process's cache; others start cold)
    t0 = time.perf_counter()
    futs = [pool.submit(r, ex) for r, ex in data]
    results = [f.result() for f in futs]
    wall = time.perf_counter() - t0
    stats = pool.stats()
    pool.close()
    acc = sum(s[0].value or 0.0 for s in results) / len(results)
    stats["verifier_s"] = statistics.fmean(s[0].latency_s for s in results)
    return wall, stats, acc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--problems", type=int, default=1_000)
    args = ap.parse_args()
    data = make_data(args.n, args.problems)
    print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}; {args.n} answers over {args.problems} references")

    wall, lat, acc = in_process(data)
    base = args.n / wall
    q = statistics.quantiles(lat, n=100)
    print(f"in-process loop (baseline): {wall:.2f}s  {base:,.0f} calls/s  latency mean "
          f"{1e3 * statistics.fmean(lat):.2f} ms  p50 {1e3 * q[49]:.2f} ms  p95 "
          f"{1e3 * q[94]:.2f} ms  p99 {1e3 * q[98]:.2f} ms  (accuracy {acc:.3f})")
    for w in (0, 1, 2):
        wall, st, acc_w = pooled(data, w)
        rate = args.n / wall
        print(f"ScoringPool workers={w}: {wall:.2f}s  {rate:,.0f} calls/s  x{rate / base:.2f} vs "
              f"baseline  round trip {1e3 * st['mean_latency_s']:.2f} ms (verifier "
              f"{1e3 * st['verifier_s']:.2f} ms)  "
              f"errors {st['error_total']}  timeouts {st['timeouts']}  (accuracy {acc_w:.3f})")
        assert abs(acc_w - acc) < 1e-9, "pool and in-process scores differ"


if __name__ == "__main__":
    main()
