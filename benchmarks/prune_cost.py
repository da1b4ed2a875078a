"""What ARRoL's pruning costs the engine per decode step: the same rows decoded by a plain
TorchEngine, by one holding a quality head (the forward pre-hook that keeps the hidden
states; requests without a rule), and with every row of a group carrying a `PruneRule`
whose checkpoint is never reached (the gated sampling path and the group's bookkeeping run
every step; the head itself runs only on rows that end, as it would on rows at their
checkpoint; nothing is cut). Model: configs/mixed.toml's Qwen2 (hidden
128, 2 layers) built at random, or ``--hidden/--layers``; ``--rows`` sequences of
``--tokens`` new tokens from one prompt, seeded, so all three decode the same tokens.

    .venv/bin/python benchmarks/prune_cost.py [--rows 192] [--tokens 64] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from reroll.config import ModelConfig
from reroll.engine import TorchEngine
from reroll.engine.quality import QualityHead, head_tensors
from reroll.models import build_tiny, load
from reroll.rollout import PruneRule, Rollout, SamplingParams


def run(model, tok, rows: int, tokens: int, mode: str) -> float:
    """Seconds per decode step."""
    ids = tok.encode("37-45+12=")
    rule = PruneRule(at=tokens + 1, keep=rows // 2, size=rows) if mode == "rules" else None
    rs = [Rollout(prompt_id="p", group_id="g", tokens=list(ids), prompt_len=len(ids),
                  index_in_group=i, sampling=SamplingParams(max_new_tokens=tokens, seed=i,
                                                            prune=rule))
          for i in range(rows)]
    e = TorchEngine(model, tok, max_batch=rows, max_seq_len=len(ids) + tokens + 1)
    if mode != "plain":
        width = model.get_output_embeddings().in_features
        e.load_head(head_tensors(QualityHead(width, tokens + 1), warm=True))
    e.generate(rs)
    s = e.stats()
    return s["time_decode_s"] / s["decode_steps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=192)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=4,
                      num_kv_heads=2, intermediate_size=2 * args.hidden,
                      max_position=128)
    with tempfile.TemporaryDirectory() as d:
        model, tok = load(build_tiny(cfg, Path(d) / "m", seed=0))
    times = {m: [] for m in ("plain", "head", "rules")}
    for _ in range(args.repeats):  # interleaved: drift in machine load hits all alike
        for m in times:
            times[m].append(run(model, tok, args.rows, args.tokens, m))
    base = statistics.median(times["plain"])
    print(f"{args.rows} rows x {args.tokens} tokens, hidden {args.hidden}, {args.layers} "
          f"layers, 1 thread; median of {args.repeats} (ms per decode step):")
    for m, v in times.items():
        med = statistics.median(v)
        print(f"  {m:6s} {med * 1e3:7.3f}  ({med / base:.3f}x plain)")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t0:.0f} s")
