"""Peak memory and time of one training forward+backward of per-token log-probs at a real
vocabulary size: full [batch, length, vocab] logits vs reroll's chunked log-probs.

A random-init Qwen2 with Qwen2.5's 151,936-token vocabulary (tied embeddings, as the small
Qwen2.5 models) but a tiny hidden size and few layers, so that the logits dominate memory.
Each variant runs in its own fresh subprocess (peaks do not mix), on the same seeded model and
random tokens, and measures one ``loss = -logp.mean(); loss.backward()``:

- ``full``: the naive loop (and reroll before 91098ae): ``model(...).logits``, then
  ``log_softmax`` over the whole ``[B, L-1, V]`` and ``gather`` of the targets;
- ``chunk=N``: reroll's `token_logprobs` with ``train.logprob_chunk = N`` (0 = the default,
  sized from the vocabulary: 2^27 logits per chunk, 883 tokens at 151,936).

Peak memory is the process's high-water RSS (``ru_maxrss``) after the call minus its RSS
just before it (a warm-up on 1 x 8 tokens runs first, so kernels and thread pools exist
without raising the high-water mark). With ``--device cuda`` the model and tokens are on the
GPU and peak memory is CUDA's: ``max_memory_allocated`` over the call (peak statistics reset
after the warm-up) minus ``memory_allocated`` just before it. Time is wall time (on CUDA
after ``torch.cuda.synchronize``) of the first measured call and the best of ``--repeats``
more. Each child saves its log-probs and gradients; the parent prints the largest
differences from ``full``.

    python benchmarks/logprob_memory.py                        # 4 x 1,024 tokens
    python benchmarks/logprob_memory.py --batch 2 --length 256 # a quick look
    python benchmarks/logprob_memory.py --device cuda          # peak CUDA memory
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MiB = 2**20


def rss_bytes() -> int:
    """Current resident set size of this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def maxrss_bytes() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def build_model(args):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(args.seed)
    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max(args.length, 64), tie_word_embeddings=True,
                      use_cache=False)
    return Qwen2ForCausalLM(cfg).eval()


def full_logprobs(model, batch):
    """The naive path (reroll's `token_logprobs` before 91098ae): the whole logits tensor."""
    import torch

    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logits = logits[:, :-1].float()  # [B, L-1, V]
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1)  # [B, L-1]


def make_batch(args, b: int, n: int, device="cpu"):
    """Seeded random tokens (drawn on the CPU: the same on every device), on ``device``."""
    import torch

    from reroll.trainer.batch import Batch

    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, args.vocab, (b, n), generator=g).to(device)
    ones = torch.ones(b, n - 1, device=device)
    return Batch(ids, torch.ones_like(ids), ids[:, 1:], ones, ones * 0,
                 torch.zeros(b, n - 1, dtype=torch.long, device=device))


def child(args) -> None:
    """One variant, in this process: warm up, measure one forward+backward, save outputs."""
    import gc
    import time

    import torch

    from reroll.trainer.batch import token_logprobs

    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"

    def sync() -> None:  # before reading a clock or a memory counter: CUDA runs async
        if cuda:
            torch.cuda.synchronize(dev)

    model = build_model(args).to(dev)  # initialised on the CPU: the same weights everywhere
    if args.variant == "full":
        def fn(batch):
            return full_logprobs(model, batch)
    else:
        chunk = int(args.variant.split("=")[1])

        def fn(batch):
            return token_logprobs(model, batch, chunk=chunk)

    def step(batch):
        model.zero_grad(set_to_none=True)
        logp = fn(batch)
        (-logp.mean()).backward()
        return logp.detach()

    step(make_batch(args, 1, 8, dev))  # warm-up: kernels, thread pool, grads allocated
    big = make_batch(args, args.batch, args.length, dev)
    gc.collect()
    sync()
    if cuda:  # CUDA's allocator: peak since the reset, over what is allocated now
        torch.cuda.reset_peak_memory_stats(dev)
        before = high_before = torch.cuda.memory_allocated(dev)
    else:
        before, high_before = rss_bytes(), maxrss_bytes()
    t0 = time.perf_counter()
    logp = step(big)
    sync()
    first = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) if cuda else maxrss_bytes()
    times = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        step(big)
        sync()
        times.append(time.perf_counter() - t0)
    grads = torch.cat([p.grad.flatten() for p in model.parameters()])
    out = Path(args.out)
    torch.save({"logp": logp.cpu(), "grads": grads.cpu()}, out / f"{args.variant}.pt")
    (out / f"{args.variant}.json").write_text(json.dumps({
        "variant": args.variant, "rss_before_mib": before / MiB,
        "high_water_before_mib": high_before / MiB, "peak_mib": (peak - before) / MiB,
        "peak_above_earlier_high": peak > high_before, "first_s": first,
        "best_s": min(times) if times else first, "loss": float(-logp.mean())}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--length", type=int, default=1024)
    ap.add_argument("--chunks", default="0,256,2048",
                    help="train.logprob_chunk values to measure (0 = the default)")
    ap.add_argument("--repeats", type=int, default=2, help="timed calls after the measured one")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu",
                    help="cpu, cuda or cuda:N; on CUDA the peak is CUDA memory, not RSS")
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # set in the child processes
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        return child(args)

    import torch

    from reroll.trainer.logprobs import chunk_rows

    variants = ["full"] + [f"chunk={c}" for c in args.chunks.split(",") if c.strip()]
    n_tok = args.batch * args.length
    print(f"Qwen2 random init: vocab {args.vocab:,}, hidden {args.hidden}, {args.layers} layers; "
          f"batch {args.batch} x {args.length} tokens = {n_tok:,} positions; full logits "
          f"{n_tok * args.vocab * 4 / MiB:,.0f} MiB in fp32; torch {torch.__version__}, "
          f"{args.threads} threads" + ("" if args.device == "cpu" else
                                        f"; device {args.device}"), flush=True)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for v in variants:
            cmd = [sys.executable, __file__, "--variant", v, "--out", tmp]
            for k in ("vocab", "hidden", "layers", "batch", "length", "repeats", "threads",
                      "seed", "device"):
                cmd += [f"--{k}", str(getattr(args, k))]
            subprocess.run(cmd, check=True, cwd=REPO)
            rows[v] = json.loads((Path(tmp) / f"{v}.json").read_text())
            saved = torch.load(Path(tmp) / f"{v}.pt", map_location="cpu")
            rows[v]["logp"], rows[v]["grads"] = saved["logp"], saved["grads"]
            print(f"  {v}: peak +{rows[v]['peak_mib']:,.0f} MiB, {rows[v]['first_s']:.2f} s "
                  f"(best {rows[v]['best_s']:.2f} s)", flush=True)
    full = rows["full"]
    print()
    measure = "peak RSS" if args.device == "cpu" else "peak CUDA memory"
    print(f"| variant | rows per chunk | {measure} over start (MiB) | x of full | first call (s) "
          "| best of repeats (s) | x of full | max abs diff log-prob | max abs diff grad |")
    print("|---|---|---|---|---|---|---|---|---|")
    for v, r in rows.items():
        rows_per = "all" if v == "full" else f"{chunk_rows(int(v.split('=')[1]), args.vocab):,}"
        dlogp = float((r["logp"] - full["logp"]).abs().max())
        dgrad = float((r["grads"] - full["grads"]).abs().max())
        print(f"| {v} | {rows_per} | {r['peak_mib']:,.0f} | {r['peak_mib'] / full['peak_mib']:.3f} "
              f"| {r['first_s']:.2f} | {r['best_s']:.2f} | {r['best_s'] / full['best_s']:.2f} "
              f"| {dlogp:.2e} | {dgrad:.2e} |")
        if not r["peak_above_earlier_high"]:
            print(f"  warning: {v}'s measured call did not raise the high-water mark set "
                  f"before it; its peak is an upper bound")
    print(f"\ngrad scale: max |grad| of full {float(full['grads'].abs().max()):.2e}; "
          f"loss full {full['loss']:.6f}")


if __name__ == "__main__":
    main()
