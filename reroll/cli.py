"""`reroll ...` entry point. Parses arguments only; every heavy import happens inside the
command that needs it, so `reroll --help` is instant.

Exit codes: 0 success, 2 bad input (config, data, checkpoint), 1 anything else.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from pathlib import Path


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="TOML config file ('-' for the defaults)")
    p.add_argument("overrides", nargs="*", help="key.path=value overrides, e.g. train.lr=3e-4")


def cmd_train(args) -> int:
    from reroll.config import load_config
    from reroll.runtime import train
    from reroll.stopping import StopFlag, Stopped, stop_on_signals

    cfg = load_config(args.config, args.overrides)  # checked by train, before any work
    try:
        with stop_on_signals(StopFlag()) as flag:
            last = train(cfg, resume=args.resume, progress=not args.no_progress, stop=flag)
    except Stopped as e:
        print(f"reroll train: {e}; checkpoint written. Resume with: {_again(args)}",
              file=sys.stderr)
        return e.exit_code
    print(json.dumps({k: round(v, 4) for k, v in last.items() if k.startswith(("reward", "eval"))}))
    return 0


def cmd_sft(args) -> int:
    import torch

    from reroll import build, build_rollout
    from reroll.config_checks import load_checked
    from reroll.lora import is_lora, plain_copy
    from reroll.runlog import RunDir
    from reroll.stopping import StopFlag, Stopped, stop_on_signals
    from reroll.trainer import checkpoint
    from reroll.trainer.precision import autocast_dtype
    from reroll.trainer.sft import save_model, sft

    cfg = load_checked(args.config, args.overrides)
    build.prepare_process(cfg)
    torch.manual_seed(cfg.train.seed)
    rd = RunDir(cfg, resume=args.resume)
    try:
        ckpt = checkpoint.latest(rd.path) if args.resume else None
        if args.resume:  # rows after the checkpoint (all of them if none) are redone
            rd.truncate(checkpoint.read_state(ckpt)["step"] if ckpt else 0)
        # float32 master weights and AdamW state; bf16 autocast where model.dtype = bfloat16;
        # with [lora], adapters over the starting model's frozen weights
        model, tok = build.load_policy(cfg, build.model_dir(cfg, rd.path), ckpt)
        task = build.build_task(cfg)
        rd.commit()

        def save(step, opt, sched, extras):
            checkpoint.save(rd.path, step, model, tok, opt, {"kind": "sft"},
                            lr_scheduler=sched, extras=extras)

        with stop_on_signals(StopFlag()) as flag:
            losses = sft(model, tok, task.train, build_rollout.encode_prompt(tok, cfg.task.chat),
                         steps=cfg.sft.steps, lr=cfg.sft.lr, batch_size=cfg.sft.batch_size,
                         seed=cfg.train.seed, schedule=cfg.sft.schedule,
                         warmup_steps=cfg.sft.warmup_steps, demos=build_rollout.demo_turns(cfg),
                         encode_observation=build_rollout.encode_observation(tok, cfg.task.chat),
                         autocast_dtype=autocast_dtype(cfg.model.dtype),
                         logprob_chunk=cfg.train.logprob_chunk,
                         fused_optimizer=cfg.train.fused_optimizer,
                         micro_tokens=cfg.sft.micro_batch_tokens,
                         log=lambda s, m: rd.log(s, m) if s % 10 == 0 or s == cfg.sft.steps
                         else None, ckpt_every=cfg.ckpt_every, save=save, resume=ckpt,
                         stop=flag)
        # saved in model.dtype (weights and config.json), as a model loaded in it would be;
        # a LoRA policy merged into a plain model, so that RL starts from it like any other
        dtype = getattr(torch, cfg.model.dtype)
        if is_lora(model):
            model = plain_copy(model, next(model.parameters()).device, dtype,
                               build.module_copy)
        out = save_model(model.to(dtype=dtype), tok, rd.path / "model")
    except Stopped as e:
        print(f"reroll sft: {e}; checkpoint written. Resume with: {_again(args)}",
              file=sys.stderr)
        return e.exit_code
    finally:
        rd.close()
    done = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "nothing left to train"
    print(f"sft: {cfg.sft.steps} steps, {done}; saved {out}")
    return 0


def _again(args) -> str:
    """The command line that resumes this run."""
    return " ".join([f"reroll {args.cmd}", args.config, *args.overrides, "--resume"])


def cmd_eval(args) -> int:
    from reroll import build
    from reroll.config import ConfigError
    from reroll.config_checks import load_checked
    from reroll.trainer.evaluate import HeldOutEval

    cfg = load_checked(args.config, args.overrides)
    build.prepare_process(cfg)
    if args.output:  # fail now, not after a long evaluation
        out = Path(args.output)
        if out.is_dir() or not out.parent.is_dir() or not os.access(out.parent, os.W_OK):
            raise ConfigError(f"--output {str(out)!r}: cannot write a file there (its "
                              f"directory must exist and be writable)")
    model, tok = _load_checkpoint(args.checkpoint, cfg)
    held_out = HeldOutEval(cfg, tok, build.build_task(cfg))
    try:
        m = held_out(model)
    finally:
        held_out.close()
    m["checkpoint"] = str(args.checkpoint)
    print(json.dumps(m))
    if args.output:
        Path(args.output).write_text(json.dumps(m, indent=1))
    return 0


def _load_checkpoint(path: str, cfg, tries: int = 3):
    """(model, tokenizer) of what ``path`` names (`reroll.build.weights_dir`), a checkpoint's
    only when it is whole. Training may rotate a checkpoint away while it is read: through a
    run directory the read is retried on its new latest checkpoint; a checkpoint named
    itself is refused, saying so."""
    from reroll import build
    from reroll.config import ConfigError
    from reroll.trainer.checkpoint import check_whole

    attempt = 0
    while True:
        src = build.weights_dir(path)
        try:
            check_whole(src)
            return build.load_model(src, cfg)
        except (ConfigError, OSError):
            if src.is_dir() and (src / "config.json").is_file():
                raise  # still there: damaged, not rotated
            attempt += 1
            if Path(path) in (src, src.parent) or attempt == tries:
                raise ConfigError(f"checkpoint {src.parent} was removed while it was read "
                                  f"(training keeps only its newest checkpoints); evaluate "
                                  f"the run directory to take its latest, or a copy") from None


def cmd_report(args) -> int:
    from reroll.report import plot_run
    from reroll.report_html import write_report

    runs = [Path(p) for p in args.run_dirs]
    out = Path(args.out) if args.out else (runs[0] / "report.html" if len(runs) == 1
                                           else Path("report.html"))
    print(write_report(runs, out))
    if not args.no_png:
        for run in runs:
            print(plot_run(run))
    return 0


def main(argv: list[str] | None = None) -> int:
    parsed: list[argparse.Namespace] = []
    try:
        return _main(argv, parsed)
    except KeyboardInterrupt:  # before the handlers, or a second signal: no traceback
        words = [w for w in (sys.argv[1:] if argv is None else argv) if not w.startswith("-")]
        what = f"reroll {parsed[0].cmd if parsed else words[0] if words else ''}".rstrip()
        more = _resumable(parsed[0]) if parsed else " before the run started"
        print(f"{what}: interrupted{more}", file=sys.stderr)
        return 130


def _main(argv: list[str] | None, parsed: list[argparse.Namespace]) -> int:
    from reroll import cli_info, export

    ap = argparse.ArgumentParser(prog="reroll", description="Rollout-centric RL post-training.")
    ap.add_argument("--version", action="version", version=f"reroll {cli_info.version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("train", help="RL training (GRPO family; sync or async)")
    _common(p)
    p.add_argument("--resume", action="store_true", help="continue the run in out_dir")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("sft", help="supervised warm start on task demonstrations")
    _common(p)
    p.add_argument("--resume", action="store_true", help="continue the sft run in out_dir")
    p.set_defaults(fn=cmd_sft)
    p = sub.add_parser("eval", help="greedy accuracy and pass@k on the held-out split")
    _common(p)
    p.add_argument("--checkpoint", required=True,
                   help="model dir, sft dir, checkpoint dir, or run dir (its latest checkpoint)")
    p.add_argument("--output", help="also write the metrics JSON here")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("report", help="a self-contained HTML page of one or more runs "
                       "(RUN_DIR/report.html) and each run's PNG (RUN_DIR/report.png)")
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="runs, overlaid in one page")
    p.add_argument("--out", help="the HTML file (default: RUN_DIR/report.html for one run, "
                   "./report.html for several)")
    p.add_argument("--no-png", action="store_true", help="skip the PNGs")
    p.set_defaults(fn=cmd_report)
    from reroll.recording.retrain import add_parser as add_replay  # reroll replay RUN_DIR

    add_replay(sub)
    cli_info.add_parsers(sub)
    export.add_parser(sub)
    from reroll.models import gguf  # reroll import GGUF_FILE OUT_DIR

    gguf.add_parser(sub)
    from reroll.serve import command as serve_command  # reroll serve MODEL_DIR
    serve_command.add_parser(sub)
    from reroll.sim import command as sim_command  # reroll sim CONFIG

    sim_command.add_parser(sub)
    args, extra = ap.parse_known_args(argv)
    bad = [x for x in extra if x.startswith("-") or "=" not in x]
    if bad or (extra and not hasattr(args, "overrides")):
        ap.error(f"unrecognized arguments: {' '.join(bad or extra)}")
    if extra:
        args.overrides = list(args.overrides) + extra
    parsed.append(args)
    from reroll.config import ConfigError

    bad_input: tuple[type[BaseException], ...] = (ConfigError, FileNotFoundError)
    try:
        from reroll.tasks.base import TaskError

        bad_input += (TaskError,)
    except ImportError:  # pragma: no cover
        pass
    try:
        return args.fn(args)
    except bad_input as e:
        print(f"reroll {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk: the message names the path
        if e.errno != errno.ENOSPC:
            raise
        print(f"reroll {args.cmd}: error: {e.strerror or e}", file=sys.stderr)
        return 2


def _resumable(args) -> str:
    """What an interrupted train or sft left: the command that resumes it, if anything."""
    if args.cmd not in ("train", "sft"):
        return ""
    try:
        import warnings

        from reroll.config import load_config

        with warnings.catch_warnings():  # said when the command started
            warnings.simplefilter("ignore")
            out = Path(load_config(args.config, args.overrides).out_dir).expanduser()
    except Exception:  # the config itself is what failed: nothing started
        return ""
    if not (out / "config.toml").is_file():
        return f" before the run started; {out} holds no run to resume"
    return f"; the last checkpoint is intact. Resume with: {_again(args)}"


if __name__ == "__main__":
    sys.exit(main())
