"""Serving overhead: `reroll serve` under 64 concurrent clients vs the same engine in process.

Workload (from `engine_throughput.py`): prompts of 6-14 characters, forced long-tail response
lengths (85% uniform 8..48 tokens, 10% 49..255, 5% at 256; EOS ignored), temperature 1, a
seed per request, the sampled token's log-prob returned. ``--clients`` clients (default 64)
each send one request at a time and the next when it returns, until ``--requests`` are
done (bounded, loopback only).

1. served: ``reroll serve MODEL --max-batch B --threads T`` in its own process, the clients
   in this one (httpx, ``POST /v1/completions`` with token ids, non-streaming).
2. in process: the same TorchEngine (max_batch B, T threads) behind an `EngineService`, the
   clients as coroutines calling ``generate`` the same way.

Prints, per system (best of ``--repeats``, interleaved): output tokens/s, p50/p99 request
latency; then served / in-process throughput and the serving overhead (1 - ratio).

    .venv/bin/python benchmarks/serve_load.py [--quick] [--model 3M] [--threads 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from engine_throughput import LIMIT, MODELS, rollouts, workload

from reroll.engine import EngineService, TorchEngine
from reroll.models import build_tiny, load


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def drive(clients: int, n: int, one) -> tuple[float, list[float]]:
    """Run ``one(i)`` for requests 0..n-1 from ``clients`` workers; (seconds, latencies)."""
    queue = list(range(n))[::-1]
    lat: list[float] = []

    async def worker():
        while queue:
            i = queue.pop()
            t = time.perf_counter()
            await one(i)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    return time.perf_counter() - t0, lat


def in_process(model_dir: Path, work, clients: int, batch: int, threads: int):
    torch.set_num_threads(threads)
    model, tok = load(model_dir)
    service = EngineService(TorchEngine(model, tok, max_batch=batch, max_seq_len=LIMIT + 32))
    rs = rollouts(work)

    async def one(i: int) -> None:
        await service.generate(rs[i])

    async def run():
        await drive(clients, 8, lambda i: service.generate(rollouts(work[:8], 10**6)[i]))
        before = dict(service.stats())
        dt, lat = await drive(clients, len(work), one)
        after = dict(service.stats())
        await service.close()
        return dt, lat, counters(before, after)

    out = asyncio.run(run())
    assert [r.response_len for r in rs] == [m for _, m in work]
    return out


def served(url: str, work, clients: int):
    async def run():
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
            async def one(i: int, seed0: int = 0) -> None:
                ids, m = work[i]
                r = await c.post("/v1/completions", json={
                    "prompt": ids, "max_tokens": m, "seed": seed0 + i, "ignore_eos": True,
                    "logprobs": 0, "return_tokens_as_token_ids": True})
                got = r.json()["choices"][0]
                assert len(got["token_ids"]) == m, r.text

            await drive(clients, 8, lambda i: one(i, 10**6))
            before = (await c.get("/metrics?format=json")).json()["engine"]
            dt, lat = await drive(clients, len(work), one)
            after = (await c.get("/metrics?format=json")).json()["engine"]
            return dt, lat, counters(before, after)

    return asyncio.run(run())


def counters(before: dict, after: dict) -> dict:
    """Engine work during a run: decode steps, prefill forwards, mean rows per step."""
    d = {k: after[k] - before.get(k, 0.0) for k in ("decode_steps", "decode_rows",
                                                     "prefill_forwards", "time_decode_s",
                                                     "time_prefill_s")}
    d["mean_batch"] = d["decode_rows"] / max(d["decode_steps"], 1.0)
    return d


def start_server(model_dir: Path, batch: int, threads: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "reroll.cli", "serve", str(model_dir),
                             "--port", "0", "--max-batch", str(batch), "--threads",
                             str(threads)], stdout=subprocess.PIPE, text=True)
    url = proc.stdout.readline().rsplit(" on ", 1)[1].strip()
    for _ in range(600):
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("reroll serve did not start")


def report(name: str, dt: float, lat: list[float], work: dict, tokens: int) -> float:
    tps = tokens / dt
    print(f"{name:>11}: {tps:8,.0f} output tokens/s  p50 {percentile(lat, .5) * 1e3:7.1f} ms  "
          f"p99 {percentile(lat, .99) * 1e3:7.1f} ms  ({dt:.2f} s; {work['decode_steps']:.0f} "
          f"decode steps of {work['mean_batch']:.1f} rows, {work['prefill_forwards']:.0f} "
          f"prefill forwards; {work['time_decode_s'] + work['time_prefill_s']:.2f} s in "
          f"engine steps)")
    return tps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="3M", choices=list(MODELS))
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--requests", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="128 requests, one repeat")
    a = ap.parse_args()
    if a.quick:
        a.requests, a.repeats = 128, 1
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny(MODELS[a.model], Path(tmp) / a.model, seed=0)
        _, tok = load(model_dir)
        work = workload(a.requests, tok)
        tokens = sum(m for _, m in work)
        print(f"{platform.node()} {os.cpu_count()} cores, torch {torch.__version__}, model "
              f"{a.model}, {a.clients} clients, {a.requests} requests ({tokens:,} output "
              f"tokens), max_batch {a.batch}, {a.threads} thread(s), load "
              f"{os.getloadavg()[0]:.1f}")
        proc, url = start_server(model_dir, a.batch, a.threads)
        best = {"in process": (float("inf"), [], {}), "served": (float("inf"), [], {})}
        try:
            for _ in range(a.repeats):
                for name, run in (("in process", lambda: in_process(
                        model_dir, work, a.clients, a.batch, a.threads)),
                                  ("served", lambda: served(url, work, a.clients))):
                    got = run()
                    if got[0] < best[name][0]:
                        best[name] = got
        finally:
            proc.terminate()
            proc.wait()
        tps = {k: report(k, *v, tokens) for k, v in best.items()}
        ratio = tps["served"] / tps["in process"]
        print(f"served / in process: {ratio:.3f}x  (serving overhead {1 - ratio:.1%}); "
              f"mean latency {statistics.fmean(best['served'][1]) * 1e3:.1f} ms vs "
              f"{statistics.fmean(best['in process'][1]) * 1e3:.1f} ms; load "
              f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
