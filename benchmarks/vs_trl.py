"""reroll vs TRL's GRPOTrainer vs a minimal hand-written GRPO loop, on the main job.

Same SFT checkpoint (configs/arithmetic.toml's model and SFT recipe, built once), same task
(two-digit addition: the same training prompts and the same 500 held-out prompts), same
hyperparameters: 16 prompts x 8 samples per step, temperature 1, at most 6 new tokens, GRPO
advantages (group mean and std), PPO clip 0.2 with one update per batch, token-mean loss,
no KL, AdamW lr 1e-4 constant, gradient clipping 1.0. Every contestant is evaluated by the
same function (greedy held-out accuracy through reroll's engine) every ``--eval-every``
steps, and evaluation time is left out of its wall time.

Contestants, run one after another in this one process' run:
  trl          TRL's GRPOTrainer (CPU: use_cpu, no vLLM, fp32), ``--threads`` torch threads
  hand         a minimal loop: transformers ``generate`` (static batch), the reward, group
               advantages, one forward/backward, AdamW (what a user might write in 80 lines)
  hand_skip    the same loop passing only samples with a nonzero advantage (same gradient)
  reroll       ``reroll train configs/arithmetic.toml`` (synchronous, max_staleness = 0)
  reroll_async the same at ``runtime.max_staleness = 1``
  reroll_threads2, ...  other settings of reroll (``VARIANTS``), e.g. two threads per side,
               or reroll_noskip: every sample through the loss passes

Prints, per contestant and seed, the median seconds per step (first ``--skip`` steps left
out) and the held-out accuracy curve; then, over the ``--seeds`` seeds, the mean seconds
per step, the seed-mean curve and the training wall time on it to ``--target`` held-out
greedy accuracy, and each ratio against reroll. TRL is an optional, benchmark-only dependency
(``pip install -c constraints.txt trl``).

    python benchmarks/vs_trl.py --steps 400 --eval-every 50 --target 0.75 --seeds 3
    python benchmarks/vs_trl.py --device cuda ...   # every contestant on a GPU
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import machine  # benchmarks/machine.py: the CPU a number was measured on
from baseline_inputs import Evaluator, RewardError, reward_fn, trl_prompts  # noqa: F401

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "arithmetic.toml"


@dataclass(frozen=True)
class Hyper:
    """What every contestant shares: the reroll config (task, verifier, model) and the GRPO
    hyperparameters TRL and the hand loop are given (reroll reads them from the config)."""
    config: Path
    prompts: int  # groups per step
    samples: int  # samples per group
    max_new: int  # max new tokens
    lr: float
    clip: float


MAIN = Hyper(CONFIG, prompts=16, samples=8, max_new=6, lr=1e-4, clip=0.2)


def setup(init: Path | None, tmp: Path):
    """The SFT checkpoint (built once with the main job's recipe), the run config, the
    task, the tokenizer and an evaluator shared by every contestant."""
    from reroll import build
    from reroll.config_checks import load_checked

    if init is None:
        init = tmp / "sft"
        subprocess.run([sys.executable, "-m", "reroll.cli", "sft", str(CONFIG),
                        f"out_dir={init}"], check=True, cwd=REPO)
    model_dir = build.weights_dir(init)
    cfg = load_checked(str(CONFIG), [f"init={init}"])
    tok = build.load_tokenizer(model_dir)
    task = build.build_task(cfg)
    return cfg, model_dir, tok, task


# ---- TRL ---------------------------------------------------------------------------------
def sync(device: str) -> None:
    """Wait for the device's queued work before a clock is read (CUDA runs asynchronously)."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


# TRL's ways to generate on a CPU without vLLM (GRPOConfig fields: the samples' distribution
# and the hyperparameters stay the same). Timed on the reasoning workload, one step each,
# interleaved on the shared 2-core box, whose speed moved 2.6x between runs, and then
# generation alone, back to back, on the same 64 prompts (benchmarks/docs/vs_trl.md, "TRL's
# fastest setting"): static 23.2 s, continuous 30.4-31.9 s (8% more tokens), dynamic 63.4-75.4 s.
# The main job's 6-token answers: untimed (vs_trl.py's command line keeps dynamic).
TRL_GENERATION = {
    "dynamic": {},  # transformers' generate, a DynamicCache: TRL's default
    "static": {"cache_implementation": "static"},  # a preallocated cache, the same tokens
    # transformers' continuous batching (paged cache): rows leave as they end
    "continuous": {"use_transformers_continuous_batching": True},
}
TRL_FASTEST = "static"


def held(curve, target: float, hold: int = 1) -> bool:
    """Whether the last ``hold`` evaluations of ``curve`` ((step, seconds, accuracy), the
    start left out) are all at or over ``target``: where a run stopped at the target stops
    (``hold`` 2: at the second evaluation in a row, so one noisy evaluation does not stop
    it)."""
    return len(curve) >= hold and all(p[2] >= target for p in curve[-hold:])


def run_trl(model_dir, tok, task, ev: Evaluator, steps: int, every: int, seed: int,
            device: str = "cpu", hp: Hyper = MAIN, cap_s: float | None = None,
            generation: str = TRL_FASTEST, start: float | None = None,
            stop_at: float | None = None, hold: int = 1):
    """TRL's GRPOTrainer with ``hp``, generating as ``TRL_GENERATION[generation]``; stops
    after ``cap_s`` seconds of training (if given), with an evaluation at that step, or at an
    evaluation that reaches ``stop_at`` (if given). Step 0's accuracy is ``start`` where the
    caller evaluated the checkpoint already, else ``ev``'s."""
    if generation not in TRL_GENERATION:
        raise ValueError(f"run_trl: generation {generation!r} is none of {list(TRL_GENERATION)}")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    score = reward_fn(tok, task, hp.config)
    ds = Dataset.from_list([{"prompt": text, "raw": ex.prompt}
                            for text, ex in zip(trl_prompts(tok, task), task.train)])

    def reward(prompts, completions, raw, **_):
        return [score(p, c) for p, c in zip(raw, completions)]

    times, curve = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            sync(device)
            times.append(time.perf_counter() - self.t0)
            capped = cap_s is not None and sum(times) >= cap_s
            if state.global_step % every == 0 or capped:
                curve.append((state.global_step, sum(times), ev(model)))
                capped = capped or (stop_at is not None
                                    and held(curve[1:], stop_at, hold))
            if capped:
                control.should_training_stop = True

    args = GRPOConfig(
        output_dir=str(Path(tempfile.mkdtemp(prefix="trl-"))), per_device_train_batch_size=hp.prompts * hp.samples,
        num_generations=hp.samples, max_completion_length=hp.max_new, temperature=1.0,
        learning_rate=hp.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, beta=0.0, epsilon=hp.clip, loss_type="dapo", scale_rewards="group",
        num_iterations=1, max_steps=steps, use_cpu=device == "cpu", bf16=False, fp16=False,
        gradient_checkpointing=False, use_vllm=False, report_to="none", save_strategy="no",
        logging_steps=10 ** 9, disable_tqdm=True, seed=seed, dataloader_num_workers=0,
        **TRL_GENERATION[generation])
    trainer = GRPOTrainer(model=str(model_dir), reward_funcs=reward, args=args,
                          train_dataset=ds, processing_class=tok, callbacks=[Clock()])
    curve.append((0, 0.0, ev(trainer.model) if start is None else start))
    trainer.train()
    return times, sorted(curve)


# ---- a minimal hand-written loop ---------------------------------------------------------
def run_hand(model_dir, tok, task, ev: Evaluator, steps: int, every: int, seed: int,
             skip: bool = False, device: str = "cpu", hp: Hyper = MAIN,
             cap_s: float | None = None, cache: str = "static", start: float | None = None,
             stop_at: float | None = None, hold: int = 1):
    """The minimal loop with ``hp``, stopped after ``cap_s`` seconds of training if given, or
    at an evaluation that reaches ``stop_at`` if given,
    generating with transformers' ``cache`` ("static" or "dynamic", its default); step 0's
    accuracy is ``start`` where the caller evaluated the checkpoint already, else ``ev``'s;
    ``skip``: the forward/backward only on samples with a nonzero
    advantage (the loss still divided by every sample's tokens: the same gradient), as
    reroll's `train.skip_zero_advantage` does."""
    import random

    import torch
    from transformers import AutoModelForCausalLM

    from reroll import build_rollout

    torch.manual_seed(seed)
    score = reward_fn(tok, task, hp.config)
    PROMPTS, SAMPLES, MAX_NEW, LR, CLIP = hp.prompts, hp.samples, hp.max_new, hp.lr, hp.clip
    model = AutoModelForCausalLM.from_pretrained(model_dir).to(device)
    model.generation_config.pad_token_id = tok.pad_token_id
    # fused, as TRL (transformers' default optim) and reroll (train.fused_optimizer) run it
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, fused=True)
    rng = random.Random(seed)
    encode = build_rollout.encode_prompt(tok)  # reroll's prompt ids: BOS, then the prompt
    times, curve = [], [(0, 0.0, ev(model) if start is None else start)]
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        exs = rng.sample(task.train, PROMPTS)
        ids = [encode(ex.prompt) for ex in exs]
        P = max(map(len, ids))  # left padding for generation
        inp = torch.tensor([[tok.pad_token_id] * (P - len(x)) + x for x in ids]).to(device)
        att = (torch.arange(P)[None] >= torch.tensor([P - len(x) for x in ids])[:, None]).long()
        att = att.to(device)
        model.eval()
        with torch.no_grad():  # static batch, KV cache; a row that samples EOS is padded
            # after it, and generation ends when every row has or at MAX_NEW. A preallocated
            # ("static") cache: 2.4-3.2x faster than the default DynamicCache on the reasoning
            # workload's 64 x 768 tokens, the same tokens (benchmarks/docs/vs_trl.md)
            out = model.generate(input_ids=inp, attention_mask=att, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=MAX_NEW,
                                 num_return_sequences=SAMPLES, eos_token_id=tok.eos_token_id,
                                 use_cache=True, disable_compile=True,
                                 cache_implementation=None if cache == "dynamic" else cache)
        comp = out[:, P:]  # [N, C]
        cmask = torch.ones_like(comp, dtype=torch.float32)
        ended = (comp == tok.eos_token_id).cumsum(-1)
        cmask[(ended - (comp == tok.eos_token_id).long()) > 0] = 0.0  # after the first EOS
        texts = tok.batch_decode(comp, skip_special_tokens=True)
        rewards = torch.tensor([score(exs[i // SAMPLES].prompt, t) for i, t in enumerate(texts)],
                               device=device)
        r = rewards.view(PROMPTS, SAMPLES)
        adv = ((r - r.mean(-1, keepdim=True)) / (r.std(-1, keepdim=True) + 1e-6)).view(-1)
        full_att = torch.cat([att.repeat_interleave(SAMPLES, 0), cmask.long()], -1)
        n_tok = cmask.sum().clamp(min=1)
        if skip:  # rows with signal (at least one, so AdamW still steps with every grad)
            live = (adv != 0).nonzero().flatten()
            live = live if len(live) else torch.tensor([0], device=device)
            out, full_att, comp, cmask, adv = (x[live] for x in (out, full_att, comp, cmask, adv))
        logits = model(input_ids=out, attention_mask=full_att).logits[:, P - 1:-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, comp[..., None]).squeeze(-1)  # [N, C]
        ratio = torch.exp(logp - logp.detach())  # one update per batch: pi_old = pi_theta
        surr = torch.minimum(ratio * adv[:, None], ratio.clamp(1 - CLIP, 1 + CLIP) * adv[:, None])
        loss = -(surr * cmask).sum() / n_tok
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sync(device)
        times.append(time.perf_counter() - t0)
        capped = cap_s is not None and sum(times) >= cap_s
        if step % every == 0 or capped:
            curve.append((step, sum(times), ev(model)))
            capped = capped or (stop_at is not None
                                    and held(curve[1:], stop_at, hold))
        if capped:
            break
    return times, curve


# ---- reroll ------------------------------------------------------------------------------
def run_reroll(init, steps: int, every: int, seed: int, tmp: Path, extra: list[str],
               device: str = "cpu"):
    """reroll's own CLI path; wall time from its metrics (evaluation time left out)."""
    out = tmp / ("reroll-" + "-".join(x.replace("=", "") for x in extra) if extra else "reroll")
    subprocess.run([sys.executable, "-m", "reroll.cli", "train", str(CONFIG), f"out_dir={out}",
                    f"init={init}", f"train.steps={steps}", f"eval.every={every}", "log_every=1",
                    f"ckpt_every={steps}", "record_every=0", f"train.seed={seed}",
                    "train.schedule=constant", f"model.device={device}", *extra],  # the main job decays; TRL here does not
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    start, evals = rows[0]["time"], 0.0  # row 0: after start-up and the first evaluation
    times, curve = [], []
    prev = start
    for r in rows[1:]:
        evals += r.get("time/eval_s", 0.0)  # the row's time stamp comes after its evaluation
        # the whole step: wall time between rows, evaluation left out
        times.append(r["time"] - prev - r.get("time/eval_s", 0.0))
        prev = r["time"]
        if "eval/greedy_accuracy" in r:
            curve.append((r["step"], r["time"] - start - evals, r["eval/greedy_accuracy"]))
    return times, [(0, 0.0, rows[0]["eval/greedy_accuracy"])] + curve


VARIANTS = {"reroll_async": ["runtime.max_staleness=1"],
            "reroll_noskip": ["train.skip_zero_advantage=false"],  # every sample passed
            "reroll_glibc": ["runtime.keep_freed_memory=false"],  # glibc's own thresholds
            # not the same algorithm: AR3PO's adaptive samples per prompt (reroll's Control)
            "reroll_ar3po_stages": ["control.allocator=ar3po_stages"],
            "reroll_ar3po_stages_async": ["control.allocator=ar3po_stages", "runtime.max_staleness=1"],
            # trainer and engine in processes of their own (true overlap, no shared GIL)
            "reroll_ray_async": ["runtime.kind=ray", "runtime.max_staleness=1"],
            "reroll_ray": ["runtime.kind=ray"],
            "reroll_threads2": ["runtime.threads=2"],  # both cores for each side, in turn
            "reroll_async_threads1": ["runtime.max_staleness=1", "runtime.threads=1"],
            # two GPUs (with --device cuda): the engine on the second, the trainer on the first
            "reroll_2gpu": ["engine.device=cuda:1"],
            "reroll_2gpu_async": ["engine.device=cuda:1", "runtime.max_staleness=1"]}


def time_to(curve, target: float) -> float | None:
    return next((t for _, t, acc in curve if acc >= target), None)


def summarise(runs: list) -> tuple[float, list]:
    """Seeds' (median s/step, curve) -> (mean s/step, the seed-mean curve: at each evaluated
    step every seed has, the mean wall time and the mean accuracy). One evaluation on 500
    prompts has a standard error of ~1.8 points, so a target near the curves' plateau is
    crossed by chance in single runs; the seed-mean curve is what to read time-to-target on."""
    steps = sorted(set.intersection(*({s for s, _, _ in c} for _, c in runs)))
    at = [{s: (t, acc) for s, t, acc in c} for _, c in runs]
    curve = [(s, statistics.fmean(x[s][0] for x in at), statistics.fmean(x[s][1] for x in at))
             for s in steps]
    return statistics.fmean(step for step, _ in runs), curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--target", default="0.85",
                    help="held-out greedy accuracy to time, or several: 0.75,0.78,0.8")
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the median")
    ap.add_argument("--seed", type=int, default=0, help="the first seed")
    ap.add_argument("--seeds", type=int, default=1,
                    help="seeds per contestant (seed, seed + 1, ...), all from one SFT checkpoint")
    ap.add_argument("--init", type=Path, default=None, help="an SFT checkpoint to start from")
    ap.add_argument("--only", default="trl,hand,reroll,reroll_async")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of trl and hand (reroll: runtime.threads of its config, "
                         "1 per side); 2 on a machine whose 2 cores are busy oversubscribes")
    ap.add_argument("--trl-generation", default="dynamic", choices=list(TRL_GENERATION),
                    help="TRL's generation (TRL_GENERATION); the main job's recorded numbers "
                         "used TRL's default, dynamic (the others not timed on it)")
    ap.add_argument("--hand-cache", default="dynamic", choices=["dynamic", "static"],
                    help="the hand loop's KV cache (the main job's recorded numbers: dynamic)")
    ap.add_argument("--device", default="cpu",
                    help="cpu, cuda or cuda:N: every contestant's model there (reroll: "
                         "model.device; TRL: use_cpu off, its own device placement)")
    ap.add_argument("--keep-freed-memory", action="store_true",
                    help="fix glibc's malloc thresholds in this process too (trl, hand), as "
                         "reroll's runtime.keep_freed_memory does in its own")
    a = ap.parse_args()
    if a.eval_every < 1:
        ap.error(f"--eval-every must be >= 1 (the benchmark times the step at which held-out "
                 f"accuracy reaches --target), got {a.eval_every}")
    import torch

    torch.set_num_threads(a.threads)
    if a.keep_freed_memory:
        from reroll.memory import keep_freed_memory

        print(f"keep_freed_memory in this process: {keep_freed_memory()}")
    tmp = Path(tempfile.mkdtemp(prefix="reroll-vs-trl-"))
    cfg, model_dir, tok, task = setup(a.init, tmp)
    init = a.init or tmp / "sft"
    names = a.only.split(",")
    unknown = [n for n in names if n not in ("trl", "hand", "hand_skip", "reroll", *VARIANTS)]
    if unknown:
        raise SystemExit(f"unknown contestant(s) {unknown}")
    runs: dict[str, list] = {}  # name -> [(median s/step, curve)] one per seed
    for seed in range(a.seed, a.seed + a.seeds):
        out = tmp / f"seed{seed}"
        out.mkdir()
        for name in names:
            ev = Evaluator(cfg, tok, task)
            t0 = time.perf_counter()
            if name == "trl":
                times, curve = run_trl(model_dir, tok, task, ev, a.steps, a.eval_every, seed,
                                       a.device, generation=a.trl_generation)
            elif name in ("hand", "hand_skip"):
                times, curve = run_hand(model_dir, tok, task, ev, a.steps, a.eval_every, seed,
                                        skip=name == "hand_skip", device=a.device,
                                        cache=a.hand_cache)
            else:
                times, curve = run_reroll(init, a.steps, a.eval_every, seed, out,
                                          VARIANTS.get(name, []), a.device)
            step = statistics.median(times[a.skip:] or times)
            runs.setdefault(name, []).append((step, curve))
            print(f"{name:13s} seed {seed} {step:.4f} s/step  wall {time.perf_counter() - t0:.0f}s"
                  f"  accuracy " + " ".join(f"{s}:{acc:.3f}" for s, _, acc in curve), flush=True)
    results = {name: summarise(rs) for name, rs in runs.items()}
    targets = [float(x) for x in str(a.target).split(",")]
    print(f"\nover {a.seeds} seed(s): mean of the median s/step; seed-mean held-out greedy "
          f"accuracy @ training wall time (evaluation left out) at each evaluation; time to "
          f"accuracy >= {', '.join(map(str, targets))} on the seed-mean curve:")
    ref = results.get("reroll")
    for name, (step, curve) in results.items():
        line = f"  {name:13s} {step:.4f} s/step"
        if ref and name != "reroll":
            line += f"  | step time vs reroll x{step / ref[0]:.2f}"
        for target in targets:
            tt = time_to(curve, target)
            line += f"  | to {target}: {tt:.1f}s" if tt is not None else \
                f"  | to {target}: not reached"
            rt = time_to(ref[1], target) if ref and name != "reroll" else None
            if tt is not None and rt:
                line += f" (vs reroll x{tt / rt:.2f})"
        print(line)
        print("    " + " ".join(f"{s}:{acc:.3f}@{t:.1f}s" for s, t, acc in curve))
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=REPO).stdout.strip()
    print(f"commit {head}, device {a.device}, torch threads {a.threads} (trl, hand); reroll "
          f"per its config; glibc thresholds fixed for trl and hand: {a.keep_freed_memory}")
    print(machine.describe())


if __name__ == "__main__":
    main()
