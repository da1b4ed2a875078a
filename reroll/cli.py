"""`reroll ...` entry point. Parses arguments only; every heavy import happens inside the
command that needs it, so `reroll --help` is instant.

Exit codes: 0 success, 2 bad input (config, data, checkpoint), 1 anything else.
"""

from __future__ import annotations

import argparse
import errno
import json
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
    from reroll.config import load_config
    from reroll.offline import run_sft
    from reroll.stopping import Stopped

    cfg = load_config(args.config, args.overrides)  # checked by run_sft, before any work
    try:
        result = run_sft(cfg, resume=args.resume, signals=True)
    except Stopped as e:
        print(f"reroll sft: {e}; checkpoint written. Resume with: {_again(args)}",
              file=sys.stderr)
        return e.exit_code
    losses = result.losses
    done = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "nothing left to train"
    print(f"sft: {cfg.sft.steps} steps, {done}; saved {result.model_dir}")
    return 0


def _again(args) -> str:
    """The command line that resumes this run."""
    return " ".join([f"reroll {args.cmd}", args.config, *args.overrides, "--resume"])


def cmd_eval(args) -> int:
    from reroll.config import load_config
    from reroll.offline import run_eval

    cfg = load_config(args.config, args.overrides)  # checked by run_eval, before any work
    print(json.dumps(run_eval(cfg, args.checkpoint, args.output)))
    return 0


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
