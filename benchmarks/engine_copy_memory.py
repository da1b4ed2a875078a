"""Peak memory of making the engine's copy of the policy: `reroll.build.module_copy` (tensor by
tensor, on the engine's device and in its dtype) against a deepcopy then ``.to(dtype)`` (how
`build_engine` made it before commit 50621a9, and what a hand-written loop does).

A random-init Qwen2 (``--hidden``, ``--layers``, ``--vocab``) in float32, as the trainer holds
its master weights; the copy in ``--dtype`` (bf16: the engine's dtype under
``model.dtype = bfloat16``). Each variant runs in a fresh subprocess; peak memory is the
high-water RSS during the copy (VmHWM, reset just before it through /proc/self/clear_refs)
minus the RSS before it (on CUDA, ``--device cuda``: peak CUDA memory over the copy minus
what was allocated before it). Both copies are checked to hold the same tensors.

    python benchmarks/engine_copy_memory.py
    python benchmarks/engine_copy_memory.py --device cuda --hidden 2048 --layers 16
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MiB = 2**20


def child(a) -> None:
    import copy

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from reroll.build import module_copy

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=4 * a.hidden,
                      num_hidden_layers=a.layers, num_attention_heads=max(1, a.hidden // 64),
                      num_key_value_heads=max(1, a.hidden // 128), tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg).to(a.device)
    dtype = getattr(torch, a.dtype)
    cuda = a.device.startswith("cuda")

    def status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {key} in /proc/self/status")

    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        Path("/proc/self/clear_refs").write_text("5")  # high-water RSS (VmHWM) := RSS now
        before = status("VmRSS")
    t0 = time.perf_counter()
    if a.variant == "module_copy":
        out = module_copy(model, a.device, dtype)
    else:
        out = copy.deepcopy(model).to(dtype=dtype)
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = status("VmHWM") - before
    seconds = time.perf_counter() - t0
    sd = {k: v.float().cpu() for k, v in out.state_dict().items()}
    torch.save(sd, a.out)
    n = sum(p.numel() for p in model.parameters())
    print(json.dumps({"peak": peak, "seconds": seconds, "params": n}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variant", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.variant:
        return child(a)
    import torch

    tmp = Path(tempfile.mkdtemp(prefix="reroll-copy-"))
    res = {}
    for variant in ("deepcopy_then_to", "module_copy"):
        out = tmp / f"{variant}.pt"
        args = [sys.executable, __file__, "--variant", variant, "--out", str(out),
                "--hidden", str(a.hidden), "--layers", str(a.layers), "--vocab", str(a.vocab),
                "--dtype", a.dtype, "--device", a.device]
        line = subprocess.run(args, check=True, capture_output=True, text=True,
                              cwd=REPO).stdout.strip().splitlines()[-1]
        res[variant] = json.loads(line)
    same = torch.load(tmp / "module_copy.pt"), torch.load(tmp / "deepcopy_then_to.pt")
    equal = same[0].keys() == same[1].keys() and all(torch.equal(same[0][k], same[1][k])
                                                      for k in same[0])
    n = res["module_copy"]["params"]
    print(f"{n:,} parameters (float32 master weights, {n * 4 / MiB:,.0f} MiB), copy in "
          f"{a.dtype} on {a.device}; peak memory added by the copy:")
    for variant, r in res.items():
        print(f"  {variant:17s} {r['peak'] / MiB:9,.0f} MiB  {r['seconds']:.2f} s")
    base, ours = res["deepcopy_then_to"]["peak"], res["module_copy"]["peak"]
    print(f"deepcopy_then_to / module_copy: x{base / max(ours, 1):.2f}; the same tensors: {equal}")


if __name__ == "__main__":
    main()
