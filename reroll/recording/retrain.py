"""`reroll replay RUN_DIR [preset=X] [key=value ...] out_dir=DIR`: train again on a run's
recorded rollouts under another advantage estimator, loss or learning rate.

The batches are the recorded ones (`reroll.recording.store`), step by step in the order the run
trained them; nothing is generated (no engine, except for held-out evaluation when
``eval.every`` asks for it). The trainer starts from the run's initial weights (its `init`,
`model.path`, or ``RUN/init``) and is built as training builds it (`build.build_trainer`,
the same seed and threads), and the one loop (`reroll.loop.run`) logs metrics.jsonl,
TensorBoard and checkpoints into ``out_dir``; ``--resume`` continues a stopped replay. With
the run's own settings it reproduces the run's updates bitwise: every logged loss and
gradient norm, and the final weights.

The config is the run's saved ``config.toml``. ``preset=X`` replaces its ``[algo]`` table
with the preset's; ``algo.*``, ``train.*``, ``eval.*``, ``log_every``, ``ckpt_every``,
``model.device``, ``model.dtype``, ``engine.device`` (where held-out evaluation generates) and
``runtime.threads`` may be set. A replay trains in this process: the recording's placement
(``runtime.kind``, ``runtime.engine_gpus``, ``runtime.trainer_gpus``,
``runtime.scoring_workers``, ``engine.device``) is reset to the local runtime's defaults,
and a recorded ``model.device`` naming a GPU this machine lacks becomes ``auto`` (both said
in the replay's notes), so a run recorded on Ray or across two GPUs replays on any machine.
Keys that shaped what was generated (``rollout.*``, ``task.*``, the rest of ``engine.*``,
``reward.*``, ``control.*``, ``replay.*``, the rest of ``runtime.*`` and ``model.*``,
``init``, DAPO's dynamic sampling and overlong shaping) are fixed by the recording: setting
one is refused, naming it.

Off-policy: under another estimator the policy being trained drifts from the one that
sampled the data after its first update, so from step 2 on the recorded rollouts are
off-policy for it. The objective's correction (``algo.correction``, truncated importance
weights pi_prox / mu with the recorded behaviour log-probs mu) is what accounts for it.

The composition lives here (config, source, loop); the reroll CLI only adds the parser.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

# where the recorded run's components ran: reset, since a replay trains in this process
PLACEMENT = {"kind": "local", "engine_gpus": 0.0, "trainer_gpus": 0.0, "scoring_workers": 0}
# key prefix -> None (the replay may change it) or why it may not; the longest prefix rules
KEYS: dict[str, str | None] = {
    "algo": None, "train": None, "eval": None, "log_every": None, "ckpt_every": None,
    "out_dir": None, "preset": None, "model.device": None, "model.dtype": None,
    "runtime.threads": None, "runtime.engine_threads": None, "engine.device": None,
    **{f"runtime.{k}": "is where the recorded run's actors ran (a replay trains in this "
                       "process)" for k in PLACEMENT},
    "algo.dynamic_sampling": "decided which groups were kept when they were generated",
    "algo.overlong_buffer": "is already in the recorded rewards (shaping at generation)",
    "algo.overlong_penalty": "is already in the recorded rewards (shaping at generation)",
    "model": "made the model that generated the rollouts",
    "init": "is where the run started (a replay starts from the run's initial weights)",
    "record_every": "does not apply (a replay trains on recorded batches, records none)",
    **{k: "shaped what was generated" for k in (
        "rollout", "task", "engine", "reward", "control", "replay", "runtime", "sft")},
}
GENERATION_ALGO = ("dynamic_sampling", "overlong_buffer", "overlong_penalty")


def refusal(key: str) -> str | None:
    """Why ``key`` cannot be changed in a replay (None: it can)."""
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in KEYS:
            return KEYS[prefix]
    return None  # an unknown key: the config build names it and the closest valid one


def reset_placement(data: dict, notes: list[str]) -> None:
    """Where the recorded run's components ran does not bind its replay, which trains in
    this process: Ray and its GPU reservations, and the engine's own device (held-out
    evaluation then follows model.device), go back to the local runtime's defaults."""
    rt, eng = data.setdefault("runtime", {}), data.setdefault("engine", {})
    was = [f"runtime.{k} = {rt[k]!r}" for k, v in PLACEMENT.items() if k in rt and rt[k] != v]
    was += [f"engine.device = {eng['device']!r}"] if eng.get("device") else []
    rt.update(PLACEMENT)
    eng["device"] = ""
    if was:
        notes.append(f"the recorded run's placement ({', '.join(was)}) does not apply: a "
                     f"replay trains in this process (set model.device / engine.device to "
                     f"choose devices)")


def device_here(data: dict, notes: list[str]) -> None:
    """A recorded ``model.device`` of a GPU this machine lacks becomes ``auto`` (cuda where
    there is one, else the CPU), said in ``notes``; a replay is the same update anywhere."""
    import torch

    from reroll.devices import cuda_visible, is_cuda_name

    name = str(data.get("model", {}).get("device", "auto"))
    if is_cuda_name(name) and not cuda_visible(name):
        data["model"]["device"] = "auto"
        notes.append(f"model.device = {name!r} as recorded, but torch sees "
                     f"{torch.cuda.device_count()} CUDA device(s) here: the replay uses "
                     f"auto")


def replay_config(run_dir: Path, overrides: list[str], notes: list[str]):
    """The run's config with the replay's preset and overrides; refused keys raise a
    ConfigError naming them. ``notes`` collects what the user should be told."""
    from reroll.config import ConfigError, RunConfig, preset_path, read_toml
    from reroll.config_checks import validate
    from reroll.tables import apply_override, build

    data = read_toml(run_dir / "config.toml")
    # a run recorded before train.fused_optimizer existed ran torch's default AdamW: its
    # replay keeps that (bitwise), where the key's new default would not
    data.setdefault("train", {}).setdefault("fused_optimizer", False)
    reset_placement(data, notes)
    items = []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.path=value")
        key = item.split("=", 1)[0].strip()
        why = refusal(key)
        if why is not None:
            placed = key.startswith("runtime.") and key.split(".", 1)[1] in PLACEMENT
            raise ConfigError(
                f"{key} cannot change in a replay: it {why}"
                f"{'' if placed else ' (the recorded rollouts fix it)'}. A replay changes "
                f"the update only: algo.* (not "
                f"{', '.join('algo.' + k for k in GENERATION_ALGO)}), train.*, eval.*, "
                f"log_every, ckpt_every, model.device, model.dtype, engine.device, "
                f"runtime.threads, runtime.engine_threads")
        items.append((key, item))
    for key, item in items:
        if key == "preset":
            apply_override(data, item)
            name = str(data["preset"])
            preset = read_toml(preset_path(name))
            kept = {k: v for k, v in data.get("algo", {}).items() if k in GENERATION_ALGO}
            data["algo"] = {**preset.get("algo", {}), **kept}
            for k in sorted(set(preset.get("algo", {})) & set(GENERATION_ALGO)):
                notes.append(f"preset {name}: algo.{k} ignored (the recording fixes it)")
            for table, vals in preset.items():
                for k, v in (vals.items() if table != "algo" else ()):
                    if data.get(table, {}).get(k) != v:
                        notes.append(f"preset {name}: {table}.{k} = {v!r} ignored; the "
                                     f"recorded run has {data.get(table, {}).get(k)!r}")
    for key, item in items:
        if key != "preset":
            apply_override(data, item)
    if "model.device" not in {k for k, _ in items}:
        device_here(data, notes)
    data["record_every"] = 0
    if "out_dir" not in {k for k, _ in items}:
        raise ConfigError("replay needs out_dir=DIR: the replay's own run directory")
    if Path(data["out_dir"]).resolve() == run_dir.resolve():
        raise ConfigError(f"out_dir is the recorded run {run_dir}; choose "
                          f"another directory")
    cfg = build(RunConfig, data)
    validate(cfg)
    return cfg


def initial_weights(run_dir: Path) -> Path:
    """Where the recorded run's trainer started: its `init`, `model.path`, or RUN/init."""
    from reroll import build
    from reroll.config import ConfigError, RunConfig, read_toml
    from reroll.tables import build as build_table

    cfg = build_table(RunConfig, read_toml(run_dir / "config.toml"))
    if cfg.init or cfg.model.path:
        try:
            return build.weights_dir(cfg.init) if cfg.init else Path(cfg.model.path)
        except FileNotFoundError as e:
            raise ConfigError(f"the run's initial weights are gone: {e} "
                              f"(run from the directory it was started in)") from None
    if not (run_dir / "init" / "config.json").is_file():
        raise ConfigError(f"{run_dir / 'init'} holds no model (the run's "
                          f"initial weights)")
    return run_dir / "init"


class RecordedBatches:
    """A `reroll.loop.BatchSource` over a recorded run: step k's batch is the groups the
    run trained at step k, in the same order."""

    def __init__(self, store, step: int = 0):
        self.store, self.step, self.consumed = store, step, 0

    def next_batch(self, trainer_version: int) -> list:
        self.step += 1
        groups = self.store.batch(self.step)
        self.consumed += len(groups)
        return groups

    def snapshot(self) -> tuple[list, dict[str, Any]]:
        return [], {"replayed_step": self.step}

    def referenced_versions(self, trainer_version: int) -> None:
        return None  # unknown: what the recorded run held is not recorded

    def stats(self) -> dict[str, Any]:
        n = self.consumed
        return {"engine": {}, "counters": {"started": n, "consumed": n, "dropped": {}},
                "score_errors": {}}


class NoTransport:
    def publish(self, version: int) -> None:
        """Nothing generates: no engine to send the weights to."""


def recorded_steps(store, run_dir: Path, want: int | None, every: int) -> int:
    """How many steps to replay: ``want`` (train.steps when set), else every recorded step
    from 1 on; each of them must be recorded (``every``: the run's record_every), and
    without ``want`` a step missing before the last recorded one is refused."""
    from reroll.config import ConfigError

    have = set(store.steps())
    n = 0
    while n + 1 in have:
        n += 1
    if want is None and have and max(have) > n:  # a step lost in the middle: never a part
        from reroll.recording.store import _ranges

        raise ConfigError(f"{run_dir}: the rollout store lacks step {n + 1} (recorded: "
                          f"{_ranges(sorted(have))}), so the run cannot be replayed whole; "
                          f"pass train.steps={n} to replay the steps before it")
    want = n if want is None else want
    if want == 0 or want > n:
        hint = ("it recorded no rollouts (record_every = 0)" if every == 0 else
                f"it recorded every {every}th step (record_every = {every}); a replay needs "
                f"every step: record_every = 1" if every > 1 else
                "pass train.steps=N with N at most the recorded steps")
        have_s = f"steps 1-{n}" if n else "no step from 1 on"
        raise ConfigError(f"{run_dir} has {have_s} recorded, the replay needs "
                          f"1-{want or 1}: {hint}")
    return want


def run(args: argparse.Namespace) -> int:
    import torch

    from reroll import build
    from reroll.config import ConfigError, TrainConfig, read_toml
    from reroll.loop import run as run_loop
    from reroll.recording.store import RolloutStore
    from reroll.runlog import RunDir
    from reroll.stopping import StopFlag, Stopped, stop_on_signals
    from reroll.trainer import checkpoint
    from reroll.trainer.schedules import SCHEDULES

    src = Path(args.run_dir)
    if not (src / "config.toml").is_file():
        raise ConfigError(f"{src} holds no run (no config.toml)")
    notes: list[str] = []
    cfg = replay_config(src, list(args.overrides), notes)
    store = RolloutStore(src)
    steps_set = any(x.split("=", 1)[0].strip() == "train.steps" for x in args.overrides)
    recorded = read_toml(src / "config.toml")
    if SCHEDULES.trait(cfg.train.schedule, "needs_steps", False) and not cfg.train.schedule_steps:
        # a schedule that decays to an end: the run's own, however many steps are replayed
        run_train = recorded.get("train", {})
        cfg.train.schedule_steps = run_train.get("schedule_steps") or run_train.get(
            "steps", TrainConfig.steps)
    cfg.train.steps = recorded_steps(store, src, cfg.train.steps if steps_set else None,
                                     recorded.get("record_every", 1))
    init_dir = initial_weights(src)
    for n in notes:
        print(f"reroll replay: {n}", file=sys.stderr)
    print(f"reroll replay: {cfg.train.steps} recorded steps of {src}; under settings other "
          f"than the run's they are off-policy from step 2 on (sampled by the run's policy); "
          f"algo.correction = {cfg.algo.correction} reweighs them with the recorded "
          f"behaviour log-probs", file=sys.stderr)
    build.prepare_process(cfg)
    torch.manual_seed(cfg.train.seed)
    rd = RunDir(cfg, resume=args.resume)
    before = rd.path / "replay.json"
    if args.resume and before.is_file() and json.loads(before.read_text())["run"] != str(
            src.resolve()):
        rd.close()
        raise ConfigError(f"--resume: {rd.path} replays "
                          f"{json.loads(before.read_text())['run']}, not {src.resolve()}")
    try:
        ckpt = checkpoint.latest(rd.path) if args.resume else None
        state = checkpoint.read_state(ckpt) if ckpt else {}
        if args.resume:
            rd.truncate(state.get("step", 0))
        trainer = build.build_trainer(cfg, init_dir, ckpt)
        evaluate, close = held_out_eval(cfg, trainer, init_dir)
        rd.commit()
        (rd.path / "replay.json").write_text(json.dumps(
            {"run": str(src.resolve()), "steps": cfg.train.steps}, indent=1))
        try:
            with stop_on_signals(StopFlag()) as flag:
                last = run_loop(build.cadence(cfg), trainer=trainer, source=RecordedBatches(
                    store, state.get("step", 0)), transport=NoTransport(), run_dir=rd,
                    evaluate=evaluate, start_step=state.get("step", 0),
                    progress=not args.no_progress, stop=flag)
        except Stopped as e:
            again = " ".join(["reroll replay", str(src), *args.overrides, "--resume"])
            print(f"reroll replay: {e}; checkpoint written. Resume with: {again}",
                  file=sys.stderr)
            return e.exit_code
        finally:
            close()
    finally:
        rd.close()
    print(json.dumps({k: round(v, 6) for k, v in last.items()
                      if k.startswith(("loss", "grad_norm", "reward", "eval"))}))
    return 0


def held_out_eval(cfg, trainer, init_dir: Path):
    """(evaluate, close): held-out evaluation of the replayed policy as a training run
    evaluates it (`reroll.trainer.evaluate.HeldOutEval`, generating on ``engine.device``),
    or nothing when ``eval.every`` is 0."""
    if not cfg.eval.every:
        return (lambda: {}), (lambda: None)
    from reroll import build
    from reroll.devices import resolved_engine_device
    from reroll.trainer.evaluate import HeldOutEval

    tok = build.load_tokenizer(init_dir)
    held_out = HeldOutEval(cfg, tok, build.build_task(cfg, tok, init_dir),
                           device=resolved_engine_device(cfg), k=1)
    return (lambda: held_out(trainer.policy())), held_out.close


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``replay`` to the reroll CLI's subcommands."""
    p = subparsers.add_parser(
        "replay", help="train again on a run's recorded rollouts (another estimator/loss)")
    p.add_argument("run_dir", help="the recorded run (its config.toml and rollouts/)")
    p.add_argument("overrides", nargs="*",
                   help="preset=NAME, algo.*/train.*/eval.* overrides, and out_dir=DIR")
    p.add_argument("--resume", action="store_true", help="continue the replay in out_dir")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(fn=run)
    return p


def main(argv: list[str] | None = None) -> int:
    from reroll.config import ConfigError

    ap = argparse.ArgumentParser(prog="python -m reroll.recording.retrain")
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_parser(sub)
    args = ap.parse_args(["replay", *(sys.argv[1:] if argv is None else argv)])
    try:
        return args.fn(args)
    except (ConfigError, FileNotFoundError) as e:
        print(f"reroll replay: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
