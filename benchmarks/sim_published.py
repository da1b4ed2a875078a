"""The published setups `benchmarks/sim_validate.py --published` predicts: AReaL- and
APRIL-like cluster runs under a cost model from first principles (every assumption below and
in benchmarks/docs/sim.md). No run, no calibration: the simulator alone."""

from __future__ import annotations

from reroll.sim.settings import SimRun, SimSettings
from reroll.sim.simulate import simulate

# Published setups (`--published`): a cost model of one H100/H800-class GPU for a dense 7-8B
# model, from first principles (bf16 weights ~15 GB read per decode step at ~3 TB/s: ~5 ms
# plus launch overhead; ~14 GFLOP a token: 30-50 us per row in decode, 30 us per prefill
# token; KV of 28 layers x 4 KV heads x 128 x K,V in bf16 = 57 KB a token read per step:
# ~20 ns per context token; training 6 x 7e9 FLOP a token at ~40% of ~1 PFLOP/s: 1e-4 s a
# token on one GPU; a weight update 5 s). Lengths: a lognormal long tail cut at the cap.
# A GPU server engine (vLLM, SGLang) places a waiting request into any free slot at every
# step and prefills in large chunks: no placement budget, no batch to wait for (reroll's
# own engine's rule, `prefill_budget` and `admit_batch`, is the CPU one).
GPU_8B = dict(decode_base_s=8e-3, decode_row_s=4e-5, decode_ctx_s=2e-8, prefill_token_s=3e-5,
              train_token_s=1e-4, sync_s=5.0, prompt_tokens=300, max_rows=256,
              prefill_budget=0, admit_batch=1)
PUBLISHED = {
    # AReaL: synchronous colocated (every GPU generates, then every GPU trains) against
    # asynchronous with 3/4 of the GPUs generating and 1/4 training, max_staleness 4
    "AReaL-like, 64 GPUs, 16k cap": (
        dict(batch_groups=64, group_size=16, max_new_tokens=16384),
        dict(lengths="lognormal", length_median=4000, length_sigma=0.8, steps=12),
        [("sync colocated", dict(gen_devices=64, train_devices=64), dict(max_staleness=0)),
         ("async 4, 48 gen + 16 train", dict(gen_devices=48, train_devices=16),
          dict(max_staleness=4))]),
    # APRIL: synchronous, colocated; over-provision 2x, abort the rest at the batch and
    # resume it next step (partial rollouts) against plain synchronous
    "APRIL-like, 8 GPUs, 8k cap": (
        dict(batch_groups=32, group_size=8, max_new_tokens=8192),
        dict(lengths="lognormal", length_median=1500, length_sigma=0.9, steps=12),
        [("sync", dict(gen_devices=8, train_devices=8), dict(max_staleness=0)),
         ("sync + overprovision 2, partial", dict(gen_devices=8, train_devices=8),
          dict(max_staleness=0, overprovision=2.0))]),
}


def published() -> None:
    """Predicted speed-ups of the published setups (every assumption above and in
    benchmarks/docs/sim.md)."""
    print("| setup | variant | samples/s | gen idle | train idle | speed-up |\n|---|---|---|---|---|---|")
    for setup, (run, lengths, variants) in PUBLISHED.items():
        base = None
        for name, hw, sched in variants:
            r = simulate(SimRun(**run, **sched, slots=256),
                         SimSettings(**GPU_8B, **lengths, **hw))
            base = base or r["samples_per_s"]
            print(f"| {setup} | {name} | {r['samples_per_s']:.2f} | {r['gen_idle']:.2f} | "
                  f"{r['train_idle']:.2f} | x{r['samples_per_s'] / base:.2f} |")
