"""Engine throughput on a long-tail length workload: TorchEngine vs transformers.

Workload: prompts of 6-14 characters; each response length is drawn from a long tail (85%
uniform in 8..48 tokens, 10% uniform in 49..255, 5% exactly at the 256 limit, like reasoning
traces where a few run to the cap). Lengths are forced, the same for every system: each
request's ``max_new_tokens`` is its drawn length and no stop token is used (EOS ignored), so
every system produces exactly the same number of useful tokens. Sampling at temperature 1,
no top-k/top-p.

Measured, same model, same run, 2 threads:
1. TorchEngine (continuous batching, max_batch = B): all requests added at once.
2. transformers ``generate`` with static batches of B (left-padded): a batch runs until its
   longest member's length; only each member's own tokens count as output.
   Each system runs ``--repeats`` times, interleaved, and keeps its best time (the machine
   is shared; the load average is printed).
3. transformers' continuous-batching manager (``init_continuous_batching`` / ``add_request``
   with per-request ``max_new_tokens``, ``max_requests_per_batch = B``), when it runs.
4. Engine overhead: decode tokens/s of the engine with B requests all running, vs a raw loop
   of ``model(...)`` forwards with a DynamicCache + argmax at the same batch and lengths.
5. Memory: RSS and KV-cache bytes while 10,000 requests (``--quick``: 1,000) pass through
   (on CUDA also the CUDA memory allocated).

``--device cuda``: the model, and every baseline, on the GPU; clocks are read after
``torch.cuda.synchronize``.

    .venv/bin/python benchmarks/engine_throughput.py [--quick] [--models 0.4M,3M] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import tempfile
import time

import torch

from reroll.config import ModelConfig
from reroll.engine import TorchEngine
from reroll.models import build_tiny, load
from reroll.rollout import Rollout, SamplingParams

MODELS = {
    "0.4M": ModelConfig(hidden_size=128, num_layers=2, intermediate_size=256, max_position=512),
    "3M": ModelConfig(hidden_size=256, num_layers=4, intermediate_size=768, max_position=512),
}
LIMIT = 256


def sync(device: torch.device) -> None:
    """Wait for the device's queued work before a clock is read (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def workload(n: int, tok, seed: int = 0) -> list[tuple[list[int], int]]:
    """n (prompt ids, forced response length) pairs with a long-tail length distribution."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(1, 99999), rng.randint(1, 999)
        prompt = tok.encode(f"{a}{rng.choice('+-*')}{b}=")
        x = rng.random()
        length = rng.randint(8, 48) if x < 0.85 else rng.randint(49, 255) if x < 0.95 else LIMIT
        out.append((prompt, length))
    return out


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rollouts(work, seed0: int = 0) -> list[Rollout]:
    return [Rollout(prompt_id=str(i), group_id=str(i), tokens=list(p), prompt_len=len(p),
                    sampling=SamplingParams(temperature=1.0, max_new_tokens=n, seed=seed0 + i))
            for i, (p, n) in enumerate(work)]


def run_engine(model, tok, work, batch: int) -> tuple[float, dict]:
    eng = TorchEngine(model, tok, max_batch=batch, max_seq_len=LIMIT + 32)
    rs = rollouts(work)
    sync(model.device)
    t0 = time.perf_counter()
    eng.add(rs)
    while eng.pending():
        eng.step()
    sync(model.device)
    dt = time.perf_counter() - t0
    assert [r.response_len for r in rs] == [n for _, n in work]
    return dt, eng.stats()


def run_static(model, tok, work, batch: int) -> float:
    from transformers import GenerationConfig

    model.generation_config.eos_token_id = None
    pad = tok.pad_token_id
    dev = model.device
    sync(dev)
    t0 = time.perf_counter()
    for i in range(0, len(work), batch):
        chunk = work[i:i + batch]
        width = max(len(p) for p, _ in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in chunk], device=dev)
        att = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in chunk],
                           device=dev)
        gc = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                              max_new_tokens=max(n for _, n in chunk), pad_token_id=pad)
        with torch.inference_mode():
            model.generate(ids, attention_mask=att, generation_config=gc)
    sync(dev)
    return time.perf_counter() - t0


def run_hf_continuous(model, tok, work, batch: int) -> tuple[float, float] | str:
    """(seconds for the requests, seconds to start the manager), or why it did not run."""
    try:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig
    except ImportError as e:
        return f"not available: {e}"
    gc = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                          max_new_tokens=LIMIT, eos_token_id=-1, pad_token_id=tok.pad_token_id)
    cb = ContinuousBatchingConfig(max_requests_per_batch=batch)
    try:
        sync(model.device)
        t0 = time.perf_counter()
        with model.continuous_batching_context_manager(
                generation_config=gc, continuous_batching_config=cb, block=True,
                timeout=30) as mgr:
            sync(model.device)
            t1 = time.perf_counter()
            ids = [mgr.add_request(list(p), max_new_tokens=n, eos_token_id=-1) for p, n in work]
            got = {}
            while len(got) < len(ids):
                r = mgr.get_result(timeout=10)
                if r is None and not mgr.is_running():
                    return "manager stopped before finishing"
                if r is not None and r.is_finished():
                    got[r.request_id] = r
            sync(model.device)
            t2 = time.perf_counter()
    except Exception as e:  # report, do not hide: the row says why there is no number
        return f"failed: {type(e).__name__}: {e}"[:160]
    if [len(got[i].generated_tokens) for i in ids] != [n for _, n in work]:
        return "lengths differ from the forced lengths"
    return t2 - t1, t1 - t0


def decode_overhead(model, tok, batch: int, steps: int) -> tuple[float, float]:
    """(engine decode tok/s, raw forward-loop tok/s), B requests all running ``steps``."""
    from transformers import DynamicCache

    prompt = tok.encode("12345+678=")
    dev = model.device
    eng = TorchEngine(model, tok, max_batch=batch, max_seq_len=LIMIT + 32)
    eng.add(rollouts([(prompt, steps + 2)] * batch))
    eng.step()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        eng.step()
    sync(dev)
    t_eng = time.perf_counter() - t0
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model(input_ids=torch.tensor([prompt] * batch, device=dev), past_key_values=cache,
                    use_cache=True)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(steps):
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
        sync(dev)
        t_raw = time.perf_counter() - t0
    return batch * steps / t_eng, batch * steps / t_raw


def memory_run(model, tok, n: int, batch: int) -> list[tuple]:
    """(requests done, RSS MiB, KV MiB[, CUDA MiB allocated on a GPU]) every n/10 finished
    requests; records are dropped as they finish, as a caller that scores and stores them
    elsewhere would."""
    dev = model.device
    eng = TorchEngine(model, tok, max_batch=batch, max_seq_len=LIMIT + 32)
    work = workload(n, tok, seed=1)
    marks, done, nxt = [], 0, 0
    while done < n:
        if eng.pending() < 2 * batch and nxt < n:  # keep the queue topped up, not all at once
            eng.add(rollouts(work[nxt:nxt + batch], seed0=nxt))
            nxt += batch
        done += len(eng.step())
        if done >= (len(marks) + 1) * n // 10:
            mark = (done, rss_bytes() / 2**20, eng.stats()["kv_cache_bytes"] / 2**20)
            if dev.type == "cuda":
                mark += (torch.cuda.memory_allocated(dev) / 2**20,)
            marks.append(mark)
    return marks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--models", default="0.4M,3M")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (every system on it)")
    ap.add_argument("--skip-hf-cb", action="store_true", help="skip transformers' CB manager")
    ap.add_argument("--repeats", type=int, default=None,
                    help="runs per system, best kept (default 1 with --quick, else 2)")
    ap.add_argument("--mem-requests", type=int, default=None,
                    help="requests of the memory run (default 10,000; 1,000 with --quick; 0 skips)")
    args = ap.parse_args()
    args.repeats = args.repeats or (1 if args.quick else 2)
    dev = torch.device(args.device)
    torch.set_num_threads(args.threads)
    n = 128 if args.quick else 512
    n_mem = args.mem_requests if args.mem_requests is not None else (
        1000 if args.quick else 10_000)
    B = args.batch
    print(f"# engine_throughput  python {platform.python_version()}  torch {torch.__version__}"
          f"  threads {args.threads}  batch {B}  requests {n}  cpu {os.cpu_count()}"
          f"  load average {os.getloadavg()[0]:.1f}  best of {args.repeats}"
          + ("" if dev.type == "cpu" else
             f"  device {dev} ({torch.cuda.get_device_name(dev)})"))
    tmp = tempfile.mkdtemp(prefix="reroll_bench_")
    for name in args.models.split(","):
        model, tok = load(build_tiny(MODELS[name], os.path.join(tmp, name), seed=0))
        model = model.to(dev).eval()
        params = sum(p.numel() for p in model.parameters())
        work = workload(n, tok)
        useful = sum(k for _, k in work)
        run_engine(model, tok, work[:B], B)  # warm-up
        t_eng = t_static = float("inf")
        for _ in range(args.repeats):  # interleaved, best of each: the CPU is shared
            t, st = run_engine(model, tok, work, B)
            t_eng = min(t_eng, t)
            t_static = min(t_static, run_static(model, tok, work, B))
        print(f"\n## {name} ({params / 1e6:.2f}M params), {n} requests, {useful} output tokens "
              f"(mean {useful / n:.0f}, max {max(k for _, k in work)})")
        print("| system | seconds | output tok/s | vs static generate |")
        print("|---|---|---|---|")
        print(f"| transformers generate, static batches of {B} | {t_static:.2f} | "
              f"{useful / t_static:,.0f} | 1.00x |")
        hf = None
        for _ in range(0 if args.skip_hf_cb else args.repeats):
            h = run_hf_continuous(model, tok, work, B)
            hf = h if not isinstance(h, tuple) or not isinstance(hf, tuple) or h[0] < hf[0] else hf
        if isinstance(hf, tuple):
            print(f"| transformers continuous batching (start {hf[1]:.1f}s excluded) | "
                  f"{hf[0]:.2f} | {useful / hf[0]:,.0f} | {t_static / hf[0]:.2f}x |")
        elif hf is not None:
            print(f"| transformers continuous batching | - | - | {hf} |")
        print(f"| **reroll TorchEngine** (max_batch {B}) | {t_eng:.2f} | {useful / t_eng:,.0f} | "
              f"**{t_static / t_eng:.2f}x** |")
        if isinstance(hf, tuple):
            print(f"\nTorchEngine vs transformers continuous batching: {hf[0] / t_eng:.2f}x")
        print(f"engine: mean occupancy {st['mean_occupancy']:.2f}, decode steps "
              f"{st['decode_steps']:.0f}, prefill {st['prefill_tokens']:.0f} tokens in "
              f"{st['prefill_forwards']:.0f} forwards ({st['time_prefill_s']:.2f}s), decode "
              f"{st['time_decode_s']:.2f}s")
        e_tps = r_tps = 0.0
        for _ in range(args.repeats):
            e, r = decode_overhead(model, tok, B, 64 if args.quick else 200)
            e_tps, r_tps = max(e_tps, e), max(r_tps, r)
        print(f"decode at batch {B}, all running: engine {e_tps:,.0f} tok/s, raw forward loop "
              f"{r_tps:,.0f} tok/s -> engine at {100 * e_tps / r_tps:.0f}% of raw")
    if n_mem <= 0:
        return
    model, tok = load(os.path.join(tmp, args.models.split(",")[0]))
    marks = memory_run(model.to(dev).eval(), tok, n_mem, B)
    print(f"\n## memory over {n_mem} requests ({args.models.split(',')[0]}, max_batch {B})")
    if dev.type == "cuda":
        print("| requests done | RSS MiB | KV cache MiB | CUDA allocated MiB |")
        print("|---|---|---|---|")
        for d, rss, kv, cu in marks:
            print(f"| {d} | {rss:.1f} | {kv:.2f} | {cu:.1f} |")
    else:
        print("| requests done | RSS MiB | KV cache MiB |")
        print("|---|---|---|")
        for d, rss, kv in marks:
            print(f"| {d} | {rss:.1f} | {kv:.2f} |")
    rss = [m[1] for m in marks]
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    print(f"RSS from the first mark to the last: {rss[-1] - rss[0]:+.1f} MiB "
          f"(max {max(rss):.1f}); KV cache constant: {len({m[2] for m in marks}) == 1}")


if __name__ == "__main__":
    main()
