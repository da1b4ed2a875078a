"""LoRA against full fine-tuning on a real model (e.g. SmolLM2-135M-Instruct after `reroll
import`): a short RL run of each in a fresh subprocess, then the publish of each.

Per variant: the run's peak RSS (trainer and engine share the process on the local
runtime, so this is both: the difference between the variants is the trainer's), the
optimiser state (its bytes in memory, summed over AdamW's tensors, and the checkpoint's
optimizer.pt and model/ on disk), the trainable parameters and seconds per RL step. Then
the publish, in one more subprocess holding both trainers so that the variants are timed
alternately under the same load: the trainer's weights for the engine (`Trainer.weights`)
and the engine's `update_weights`, the median of 7 each (``--repeats``), with the bytes
each sends, for full fine-tuning and for LoRA's publishes: merged (the first, every tensor,
the targeted ones W + (alpha/r) BA; later ones, ``trained_only``, the targeted modules
alone) and in adapter form, what a run sends (the first, every tensor, the targeted ones as
their frozen base plus A, B and scale; later ones, the adapters alone, merged by the engine).

    reroll import SmolLM2-135M-Instruct.Q4_1.gguf hf/smol
    python benchmarks/lora.py hf/smol [--steps 3] [--rank 16] [--targets all-linear]
    python benchmarks/lora.py hf/smol --variant publish --targets q_proj,v_proj   # publish only
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MiB = 2**20


def overrides(a, out: Path, lora: bool) -> list[str]:
    o = [f"model.path={a.model}", "model.dtype=float32", f"out_dir={out}",
         "rollout.max_new_tokens=16", "rollout.group_size=4", "rollout.batch_groups=2",
         f"train.steps={a.steps}", f"ckpt_every={a.steps}", "eval.n_examples=0",
         "reward.workers=0", "record_every=0", "log_every=1", "train.lr=1e-5"]
    targets = "[" + ",".join(f'"{t}"' for t in a.targets.split(",")) + "]"
    return o + ([f"lora.rank={a.rank}", f"lora.alpha={2 * a.rank}",
                 f"lora.target_modules={targets}"] if lora else [])


def child(a) -> None:
    import torch

    from reroll.config_checks import load_checked
    from reroll.runlog import read_metrics
    from reroll.runtime import train

    lora = a.variant == "lora"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        cfg = load_checked(None, overrides(a, out, lora))
        t0 = time.perf_counter()
        train(cfg, progress=False)
        wall = time.perf_counter() - t0
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
        rows = read_metrics(out)
        ckpt = out / "checkpoints" / f"step_{a.steps:06d}"
        opt_file = (ckpt / "optimizer.pt").stat().st_size
        model_files = sum(f.stat().st_size for f in (ckpt / "model").iterdir())
        state = torch.load(ckpt / "optimizer.pt", weights_only=False)["optimizer"]["state"]
        opt_bytes = sum(v.numel() * v.element_size() for s in state.values()
                        for v in s.values() if torch.is_tensor(v))
        trainable = sum(v.numel() for s in state.values() for v in s.values()
                        if torch.is_tensor(v) and v.dim() > 0) // 2  # exp_avg, exp_avg_sq
    print(json.dumps({
        "variant": a.variant, "peak_rss_mib": peak / MiB, "optimizer_state_mib": opt_bytes / MiB,
        "optimizer_pt_mib": opt_file / MiB, "checkpoint_model_mib": model_files / MiB,
        "trainable_params": trainable, "s_per_step": wall / a.steps, "rows": len(rows)}))


def publish(a) -> None:
    import torch

    from reroll import build
    from reroll.config_checks import load_checked

    with tempfile.TemporaryDirectory() as tmp:
        cfgs = {v: load_checked(None, overrides(a, Path(tmp) / v, v == "lora"))
                for v in ("full", "lora")}
        build.prepare_process(cfgs["full"])
        torch.manual_seed(0)
        trainers = {v: build.build_trainer(c, Path(a.model)) for v, c in cfgs.items()}
        engine = build.build_engine(trainers["full"].policy(), trainers["full"].tokenizer,
                                    cfgs["full"])
        # (trainer, trained_only, adapters), in this order within a repeat: a plain full
        # publish frees the engine's kept bases, "adapter_all" sends them again
        kinds = {"full": ("full", False, False), "lora_all": ("lora", False, False),
                 "lora": ("lora", True, False), "adapter_all": ("lora", False, True),
                 "adapter": ("lora", True, True)}
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
        sent: dict[str, int] = {}
        for i in range(a.repeats):
            for k, (v, part, adapters) in kinds.items():
                t0 = time.perf_counter()
                weights = trainers[v].weights(trained_only=part, adapters=adapters)
                t1 = time.perf_counter()
                engine.update_weights(weights, i + 1)
                times[k].append((t1 - t0, time.perf_counter() - t1))
                sent[k] = sum(w.numel() * w.element_size() for w in weights.values())
                del weights
            kept = engine.stats()["lora_base_bytes"]
    out = {"engine_lora_base_mib": kept / MiB}
    for k, ts in times.items():  # the whole publish, then its two halves
        out[f"publish_{k}_s"] = statistics.median(w + u for w, u in ts)
        out[f"publish_{k}_min_s"] = min(w + u for w, u in ts)
        out[f"publish_{k}_weights_s"] = statistics.median(w for w, _ in ts)
        out[f"publish_{k}_load_s"] = statistics.median(u for _, u in ts)
        out[f"publish_{k}_mib"] = sent[k] / MiB
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", help="a Hugging Face model folder (e.g. from `reroll import`)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=7, help="publishes timed per variant")
    ap.add_argument("--targets", default="all-linear",
                    help="lora.target_modules, comma-separated (e.g. q_proj,v_proj)")
    ap.add_argument("--variant", choices=("full", "lora", "publish"))
    a = ap.parse_args()
    if a.variant:
        return publish(a) if a.variant == "publish" else child(a)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from machine import describe

    print(describe())
    res = {}
    for variant in ("full", "lora", "publish"):
        r = subprocess.run([sys.executable, __file__, a.model, "--steps", str(a.steps),
                            "--rank", str(a.rank), "--targets", a.targets,
                            "--variant", variant],
                           capture_output=True, text=True, check=True)
        res[variant] = json.loads(r.stdout.strip().splitlines()[-1])
        print(json.dumps(res[variant]))
    f, lo, p = res["full"], res["lora"], res["publish"]
    print(f"peak RSS: full {f['peak_rss_mib']:.0f} MiB, LoRA {lo['peak_rss_mib']:.0f} MiB; "
          f"optimiser state {f['optimizer_state_mib']:.1f} -> {lo['optimizer_state_mib']:.2f} "
          f"MiB; publish {p['publish_full_s']:.3f} -> {p['publish_adapter_s']:.3f} s "
          f"({p['publish_full_mib']:.1f} -> {p['publish_adapter_mib']:.1f} MiB; merged, "
          f"targeted only: {p['publish_lora_s']:.3f} s, {p['publish_lora_mib']:.1f} MiB); step "
          f"{f['s_per_step']:.2f} -> {lo['s_per_step']:.2f} s")


if __name__ == "__main__":
    main()
