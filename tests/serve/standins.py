"""Stand-ins for vLLM's and SGLang's servers: Starlette apps that answer with the request and
response shapes those projects document (vLLM: ``/v1/completions`` with token-id prompts,
``logprobs``, ``return_tokens_as_token_ids``, and the dev-mode routes ``/pause``,
``/resume``, ``/is_paused``, ``/collective_rpc``, ``/reset_prefix_cache``; SGLang:
``/generate`` with ``return_logprob``, ``meta_info.output_token_logprobs``,
``/update_weights_from_disk``, ``/abort_request``, ``/get_model_info``), around a fake model.

The fake model samples token ``(seed + position) % 50 + 3`` with log-prob ``-w - position /
1000``, where ``w`` is the value of the tensor ``w`` in MODEL_DIR/model.safetensors (weights
pushed by reroll change it, so a test reads which weights served each token). A token takes
``--delay-ms``, so pushes and aborts can land mid-request. ``GET /calls`` lists the routes
called, in order; ``GET /produced`` counts the tokens sampled.

Run: ``python standins.py vllm|sglang MODEL_DIR [--no-dev] [--delay-ms N] [--port N]``;
prints the URL.
"""

import argparse
import asyncio
import socket
from pathlib import Path

import uvicorn
from safetensors.numpy import load_file
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


class FakeModel:
    def __init__(self, model_dir: Path, delay_s: float):
        self.dir, self.delay_s = model_dir, delay_s
        self.w, self.version = self.load(model_dir), None
        self.paused = asyncio.Event()
        self.paused.set()  # set: running
        self.aborted: set[str] = set()
        self.running: set[str] = set()
        self.calls: list[str] = []
        self.produced = 0  # tokens sampled, all requests

    @staticmethod
    def load(path: Path) -> float:
        return float(load_file(str(path / "model.safetensors"))["w"].reshape(-1)[0])

    async def sample(self, rid: str, ids: list[int], n: int, seed: int):
        """(tokens, logprobs, finish) for one request; "abort" when stopped on the way."""
        toks, lps = [], []
        self.running.add(rid)
        try:
            await self.paused.wait()  # vLLM holds new requests while paused
            for i in range(n):
                await asyncio.sleep(self.delay_s)
                if rid in self.aborted:  # stopped: nothing more is sampled for it
                    return toks, lps, "abort"
                pos = len(ids) + i
                toks.append((seed + pos) % 50 + 3)
                self.produced += 1
                lps.append(-self.w - pos / 1000)
            return toks, lps, "length"
        finally:
            self.running.discard(rid)
            self.aborted.discard(rid)

    def abort_all(self) -> None:
        self.aborted |= self.running


def vllm_routes(m: FakeModel, dev: bool) -> list[Route]:
    async def completions(request: Request):
        b = await request.json()
        m.calls.append("/v1/completions")
        assert isinstance(b["prompt"], list) and b["logprobs"] == 0
        assert b["return_tokens_as_token_ids"] is True and b["ignore_eos"] is True
        rid = request.headers["x-request-id"]
        toks, lps, finish = await m.sample(rid, b["prompt"], b["max_tokens"], b["seed"] or 0)
        return JSONResponse({
            "id": f"cmpl-{rid}", "object": "text_completion", "created": 0, "model": "standin",
            "choices": [{"index": 0, "text": "x" * len(toks), "finish_reason": finish,
                         "stop_reason": None, "prompt_logprobs": None,
                         "logprobs": {"text_offset": list(range(len(toks))),
                                      "token_logprobs": lps,
                                      "tokens": [f"token_id:{t}" for t in toks],
                                      "top_logprobs": [{f"token_id:{t}": lp}
                                                       for t, lp in zip(toks, lps)]}}],
            "usage": {"prompt_tokens": len(b["prompt"]), "completion_tokens": len(toks),
                      "total_tokens": len(b["prompt"]) + len(toks)}})

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "standin", "object": "model"}]})

    async def pause(request: Request):
        m.calls.append(f"/pause?mode={request.query_params.get('mode', 'abort')}")
        m.paused.clear()
        if request.query_params.get("mode", "abort") == "abort":
            m.abort_all()
        return JSONResponse({"status": "paused"})

    async def resume(request: Request):
        m.calls.append("/resume")
        m.paused.set()
        return JSONResponse({"status": "resumed"})

    async def is_paused(request: Request):
        return JSONResponse({"is_paused": not m.paused.is_set()})

    async def rpc(request: Request):
        b = await request.json()
        m.calls.append(f"/collective_rpc {b['method']}")
        if b["method"] != "reload_weights":
            return JSONResponse({"error": f"no method {b['method']}"}, status_code=400)
        m.w = m.load(m.dir)  # the workers reload the directory the server started from
        return JSONResponse({"results": [None]})

    async def reset(request: Request):
        m.calls.append("/reset_prefix_cache")
        return Response(status_code=200)

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"])]
    if dev:  # VLLM_SERVER_DEV_MODE=1
        routes += [Route("/pause", pause, methods=["POST"]),
                   Route("/resume", resume, methods=["POST"]),
                   Route("/is_paused", is_paused, methods=["GET"]),
                   Route("/collective_rpc", rpc, methods=["POST"]),
                   Route("/reset_prefix_cache", reset, methods=["POST"])]
    return routes


def sglang_routes(m: FakeModel, dev: bool) -> list[Route]:
    async def generate(request: Request):
        b = await request.json()
        m.calls.append("/generate")
        sp = b["sampling_params"]
        assert b["return_logprob"] is True and b["logprob_start_len"] == -1
        toks, lps, finish = await m.sample(b["rid"], b["input_ids"], sp["max_new_tokens"],
                                           sp.get("sampling_seed", 0))
        return JSONResponse({"text": "x" * len(toks), "output_ids": toks, "meta_info": {
            "id": b["rid"], "finish_reason": {"type": finish, "length": len(toks)}
            if finish == "length" else {"type": finish},
            "prompt_tokens": len(b["input_ids"]), "completion_tokens": len(toks),
            "cached_tokens": 0, "weight_version": m.version,
            "output_token_logprobs": [[lp, t, None] for t, lp in zip(toks, lps)]}})

    async def update(request: Request):
        b = await request.json()
        m.calls.append("/update_weights_from_disk")
        path = Path(b["model_path"])
        if not (path / "model.safetensors").is_file():
            return JSONResponse({"success": False, "message": f"no weights in {path}",
                                 "num_paused_requests": 0}, status_code=400)
        if b.get("abort_all_requests"):
            m.abort_all()
        m.w, m.version = m.load(path), b.get("weight_version")
        return JSONResponse({"success": True, "message": "Succeeded to update model weights.",
                             "num_paused_requests": 0})

    async def abort(request: Request):
        b = await request.json()
        m.calls.append("/abort_request")
        m.aborted.add(b["rid"])
        return Response(status_code=200)

    async def info(request: Request):
        return JSONResponse({"model_path": str(m.dir), "tokenizer_path": str(m.dir),
                             "is_generation": True, "weight_version": m.version})

    return [Route("/generate", generate, methods=["POST"]),
            Route("/update_weights_from_disk", update, methods=["POST"]),
            Route("/abort_request", abort, methods=["POST"]),
            Route("/get_model_info", info, methods=["GET"])]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["vllm", "sglang"])
    ap.add_argument("model_dir")
    ap.add_argument("--no-dev", action="store_true")
    ap.add_argument("--delay-ms", type=float, default=2.0)
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    m = FakeModel(Path(a.model_dir), a.delay_ms / 1000)

    async def calls(request: Request):
        return JSONResponse(m.calls)

    async def produced(request: Request):
        return JSONResponse(m.produced)

    routes = (vllm_routes if a.kind == "vllm" else sglang_routes)(m, not a.no_dev)
    app = Starlette(routes=routes + [Route("/calls", calls, methods=["GET"]),
                                     Route("/produced", produced, methods=["GET"])])
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", a.port))
    print(f"standin {a.kind} on http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


if __name__ == "__main__":
    main()
