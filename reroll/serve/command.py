"""`reroll serve MODEL_DIR`: the CLI glue that loads a model, builds the TorchEngine and the
app (`reroll.serve.app`) and runs it under uvicorn. Parses arguments only; the reroll CLI
adds the parser (`add_parser`) and calls `run`."""

from __future__ import annotations

import argparse
import os
import sys

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the TorchEngine "
                       "(continuous batching, token ids and behaviour log-probs, weight "
                       "updates)")
    p.add_argument("model_dir", help="model dir, sft dir, checkpoint dir, or run dir (its "
                   "latest checkpoint)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback "
                   "only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free one; the URL is "
                   "printed)")
    p.add_argument("--token", default=os.environ.get("REROLL_SERVE_TOKEN", ""),
                   help="require 'Authorization: Bearer TOKEN' (default: $REROLL_SERVE_TOKEN)")
    p.add_argument("--served-model-name", default="", help="the model's name in the API "
                   "(default: the directory's name)")
    p.add_argument("--max-batch", type=int, default=64, help="KV-cache slots (sequences "
                   "decoded together)")
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--device", default="auto", help="cpu, cuda, or auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--max-body-mb", type=float, default=8.0, help="largest request body, "
                   "weights excepted")
    p.add_argument("--max-weights-mb", type=float, default=16384.0, help="largest weight "
                   "update sent as tensors")
    p.add_argument("--max-request-sequences", type=int, default=1024, help="most sequences "
                   "(prompts x n) one request may ask for; more is refused with 400")
    p.add_argument("--max-client-sequences", type=int, default=16384, help="most sequences one "
                   "client (address) may have queued or running; more is refused with 429")
    p.add_argument("--no-weight-updates", action="store_true", help="refuse /v1/weights")
    p.add_argument("--stream-interval-ms", type=float, default=50.0, help="how often streamed "
                   "responses receive the tokens sampled since their last chunk")
    p.add_argument("--wave-timeout-s", type=float, default=2.0, help="how long requests of "
                   "one wave wait for the rest of it")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    p.set_defaults(fn=run)


def run(args: argparse.Namespace) -> int:
    import socket
    from pathlib import Path

    import torch

    try:
        import uvicorn
    except ImportError as e:  # the serve extra is not installed
        print(f"reroll serve: error: {e}; install the serve extra: pip install -e '.[serve]'",
              file=sys.stderr)
        return 2

    from reroll import build
    from reroll.devices import resolve_device
    from reroll.engine import TorchEngine
    from reroll.models import load
    from reroll.serve.app import create_app
    from reroll.serve.backend import ServeBackend

    if args.threads > 0:
        torch.set_num_threads(args.threads)  # the engine's thread, started later, inherits it
    path = build.weights_dir(args.model_dir)
    build.quiet_transformers()
    model, tok = load(path, args.dtype)
    model = model.to(resolve_device(args.device))
    name = args.served_model_name or Path(args.model_dir).resolve().name
    core = TorchEngine(model.eval(), tok, max_batch=args.max_batch)
    backend = ServeBackend(core, tok, model_name=name, updatable=not args.no_weight_updates,
                           stream_interval_s=args.stream_interval_ms / 1000.0,
                           wave_timeout_s=args.wave_timeout_s)
    app = create_app(backend, token=args.token, max_body_bytes=int(args.max_body_mb * 2**20),
                     max_weights_bytes=int(args.max_weights_mb * 2**20),
                     max_request_sequences=args.max_request_sequences,
                     max_client_sequences=args.max_client_sequences)
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    host = f"[{args.host}]" if family == socket.AF_INET6 else args.host
    url = f"http://{host}:{sock.getsockname()[1]}"
    if args.host not in LOOPBACK and not args.token:
        print(f"reroll serve: warning: listening on {args.host} with no --token: anyone who "
              f"reaches this port can generate and replace the weights", file=sys.stderr)
    print(f"reroll serve: {name} ({path}) on {url}", flush=True)
    config = uvicorn.Config(app, log_level=args.log_level, access_log=False, lifespan="on",
                            timeout_keep_alive=30)
    server = uvicorn.Server(config)
    server.run(sockets=[sock])
    # Ctrl-C or SIGTERM: uvicorn shuts down and raises the signal again, but asyncio's runner
    # drops it when its task has already finished (then run() returns normally): a server
    # that started and was told to exit was interrupted, whichever way the signal went
    if server.started and server.should_exit:
        raise KeyboardInterrupt
    return 0
