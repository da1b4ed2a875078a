"""One AdamW step: torch's fused kernel (reroll's `train.fused_optimizer`, the default, and
transformers' default `adamw_torch_fused`) against torch's default implementation (a Python
loop over the parameters on the CPU, foreach kernels on CUDA) and the foreach one, in the
same run.

The model is `configs/arithmetic.toml`'s (built locally, random init) unless ``--hidden`` /
``--layers`` say otherwise; every parameter gets the same seeded gradient in every variant,
each variant steps from the same weights ``--warmup`` times and then ``--steps`` more, timed
one by one (on CUDA after a synchronize). Prints the median time of each, the ratios, and the
largest difference of the weights after the first step from the default implementation's.

    python benchmarks/optimizer_step.py
    python benchmarks/optimizer_step.py --hidden 896 --layers 24   # about Qwen2.5-0.5B's size
    python benchmarks/optimizer_step.py --device cuda
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VARIANTS = {"default": {}, "foreach": {"foreach": True}, "fused": {"fused": True}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=0, help="0: configs/arithmetic.toml's model")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    import torch

    from reroll.config_checks import load_checked
    from reroll.models import build_tiny, load

    torch.set_num_threads(a.threads)
    mc = load_checked(str(REPO / "configs" / "arithmetic.toml"), []).model
    if a.hidden:
        mc.hidden_size, mc.intermediate_size, mc.num_layers = a.hidden, 4 * a.hidden, a.layers
        mc.num_heads = mc.num_kv_heads = max(1, a.hidden // 64)
    model, _ = load(build_tiny(mc, Path(tempfile.mkdtemp(prefix="reroll-opt-")), seed=0))
    model.to(a.device)
    n = sum(p.numel() for p in model.parameters())
    gen = torch.Generator().manual_seed(0)
    grads = [(torch.randn(p.shape, generator=gen) * 1e-3).to(a.device)
             for p in model.parameters()]

    def sync():
        if a.device.startswith("cuda"):
            torch.cuda.synchronize()

    times, first = {}, {}
    for name, kw in VARIANTS.items():
        m = copy.deepcopy(model)
        params = list(m.parameters())
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0, **kw)
        opt.step()
        first[name] = [p.detach().clone() for p in params]
        for _ in range(a.warmup):
            opt.step()
        ts = []
        for _ in range(a.steps):
            sync()
            t0 = time.perf_counter()
            opt.step()
            sync()
            ts.append(time.perf_counter() - t0)
        times[name] = statistics.median(ts)
    print(f"{n:,} parameters in {len(grads)} tensors, {a.device}, {a.threads} thread(s), "
          f"median of {a.steps} steps")
    for name in VARIANTS:
        diff = max(float((x - y).abs().max()) for x, y in zip(first[name], first["default"]))
        print(f"{name:8s} {times[name] * 1e3:8.3f} ms   default / this x{times['default'] / times[name]:5.2f}"
              f"   max |w - default's| after one step {diff:.1e}")


if __name__ == "__main__":
    main()
