"""The HTTP face of `reroll serve`: an OpenAI-compatible Starlette app over a `ServeBackend`.

Routes: ``POST /v1/completions`` (prompt as text or token ids, one or several; token ids,
per-token behaviour log-probs and policy versions back; ``seed`` honoured per request),
``POST /v1/chat/completions`` (messages rendered by the tokenizer's chat template),
``GET /v1/models``, ``POST /v1/abort`` (by request id), ``POST /v1/weights`` (safetensors
bytes with ``?version=N``, or JSON ``{"path", "version"}``), ``GET /health`` and ``GET
/metrics`` (Prometheus text; ``?format=json`` for JSON). ``stream: true`` answers with
server-sent events as tokens are sampled.

Owns request handling: an optional bearer token (every route but ``/health``), body size
limits, reading weights (a tensor file that cannot be read is a 400), and errors as OpenAI error objects with a 4xx status and a reason;
nothing a client sends can stop the server. Generation requests are turned into engine jobs
and answered by `reroll.serve.generation`; the engine's internals are `reroll.serve.backend`'s.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections import Counter
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from reroll.serve import openai_format as fmt
from reroll.serve.backend import ServeBackend
from reroll.serve.generation import Generation
from reroll.serve.schemas import (
    AbortBody,
    BadRequest,
    ChatRequest,
    CompletionRequest,
    WeightsPathBody,
    parse,
)

log = logging.getLogger("reroll.serve")


def _error(e: BadRequest) -> JSONResponse:
    return JSONResponse(fmt.error_body(str(e), e.status, e.param, e.code), status_code=e.status)


class _Guard:
    """ASGI middleware: the bearer token on every route but ``/health``."""

    def __init__(self, app, token: str, counts: Counter):
        self.app, self.expected, self.counts = app, f"Bearer {token}".encode(), counts
        self.token = token

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.token and scope["path"] != "/health":
            got = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.expected):
                self.counts["errors_401"] += 1
                await _error(BadRequest("missing or wrong bearer token (Authorization: Bearer "
                                        "...)", status=401, code="invalid_api_key")
                             )(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _route(fn):
    """Count the request; a `BadRequest` becomes its 4xx, anything else a 500 with a reason."""

    async def run(self: _Handlers, request: Request) -> Response:
        self.http["requests"] += 1
        try:
            return await fn(self, request)
        except BadRequest as e:
            self.http[f"errors_{e.status}"] += 1
            return _error(e)
        except ClientDisconnect:  # nobody is left to answer
            self.http["client_disconnects"] += 1
            return Response(status_code=499)
        except Exception as e:  # a bug here must not take the server down
            log.exception("reroll serve: %s %s failed", request.method, request.url.path)
            self.http["errors_500"] += 1
            return _error(BadRequest(f"internal error: {e!r}", status=500))

    return run


class _Handlers:
    def __init__(self, backend: ServeBackend, max_body: int, max_weights: int, **bounds: int):
        self.b, self.max_body, self.max_weights = backend, max_body, max_weights
        self.gen = Generation(backend, **bounds)
        self.http: Counter = Counter()

    # ---- bodies -----------------------------------------------------------------------------
    async def _body(self, request: Request, limit: int) -> bytes:
        size = request.headers.get("content-length", "")
        if size.isdigit() and int(size) > limit:
            raise BadRequest(f"the body of {int(size)} bytes exceeds the limit of {limit} bytes",
                             status=413, code="body_too_large")
        buf = bytearray()
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > limit:
                raise BadRequest(f"the body exceeds the limit of {limit} bytes", status=413,
                                 code="body_too_large")
        return bytes(buf)

    async def _json(self, request: Request) -> Any:
        raw = await self._body(request, self.max_body)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise BadRequest(f"the body is not valid JSON: {e}") from None

    def _model(self, name: str | None) -> None:
        if name is not None and name != self.b.model_name:
            raise BadRequest(f"model {name!r} not found; this server serves "
                             f"{self.b.model_name!r}", status=404, param="model",
                             code="model_not_found")

    # ---- routes -----------------------------------------------------------------------------
    @_route
    async def completions(self, request: Request) -> Response:
        req = parse(CompletionRequest, await self._json(request))
        self._model(req.model)
        prompts = [self.gen.ids(p) for p in req.prompts()]
        rid = req.request_id or request.headers.get("x-request-id")
        return await self.gen.respond(rid, req, prompts, req.max_tokens, chat=False,
                                      client=_client(request))

    @_route
    async def chat(self, request: Request) -> Response:
        req = parse(ChatRequest, await self._json(request))
        self._model(req.model)
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        rid = req.request_id or request.headers.get("x-request-id")
        return await self.gen.respond(rid, req, [self.gen.chat_ids(req)], limit, chat=True,
                                      client=_client(request))

    @_route
    async def abort(self, request: Request) -> Response:
        req = parse(AbortBody, await self._json(request))
        ids = None if req.all else [rid for rid in list(self.b.jobs) if any(
            rid == x or rid.startswith(x + "-") for x in req.request_ids)]
        return JSONResponse({"aborted": await self.b.abort(ids)})

    @_route
    async def weights(self, request: Request) -> Response:
        kind = request.headers.get("content-type", "").split(";")[0].strip()
        if kind == "application/json":
            req = parse(WeightsPathBody, await self._json(request))
            state = await asyncio.to_thread(_load_path, req.path)
            version, interrupt = req.version, req.interrupt
        else:
            q = request.query_params
            if not q.get("version", "").isdigit():
                raise BadRequest("send ?version=N (an integer >= 0) with the tensors",
                                 param="version")
            version = int(q["version"])
            interrupt = q.get("interrupt", "true").lower() not in ("false", "0")
            raw = await self._body(request, self.max_weights)
            state = await asyncio.to_thread(_load_bytes, raw)
        await self.b.update_weights(state, version, interrupt)
        return JSONResponse({"version": version, "tensors": len(state)})

    @_route
    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._card()]})

    @_route
    async def model(self, request: Request) -> Response:
        self._model(request.path_params["model"])
        return JSONResponse(self._card())

    def _card(self) -> dict:
        return {"id": self.b.model_name, "object": "model", "created": 0, "owned_by": "reroll",
                "max_model_len": self.b.context, "policy_version": self.b.version}

    async def health(self, request: Request) -> Response:
        why = self.b.healthy()
        body = {"status": "ok" if why is None else "error", "model": self.b.model_name,
                "version": self.b.version, "weight_updates": self.b.updatable,
                "context": self.b.context, "running": len(self.b.jobs)}
        if why is not None:
            body["reason"] = why
        return JSONResponse(body, status_code=200 if why is None else 503)

    @_route
    async def metrics(self, request: Request) -> Response:
        stats = self.b.stats()
        if request.query_params.get("format") == "json":
            return JSONResponse({"engine": stats, "http": dict(self.http)})
        return PlainTextResponse(fmt.prometheus(stats, dict(self.http)))


def _client(request: Request) -> str:
    """Who a request counts against for the per-client bound: its peer address."""
    return request.client.host if request.client is not None else ""


def _load_bytes(raw: bytes) -> dict:
    from safetensors.torch import load

    try:
        return load(raw)
    except Exception as e:
        raise BadRequest(f"the body is not a safetensors file: {e}") from None


def _load_path(path: str) -> dict:
    """A safetensors file, or every ``*.safetensors`` file of a directory (a model folder)."""
    from pathlib import Path

    from safetensors.torch import load_file

    p = Path(path)
    files = sorted(p.glob("*.safetensors")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise BadRequest(f"{path}: no safetensors file there (a file, or a directory holding "
                         f"*.safetensors)", param="path")
    state: dict = {}
    try:
        for f in files:
            state.update(load_file(str(f)))
    except Exception as e:
        raise BadRequest(f"{path}: cannot read the weights: {e}", param="path") from None
    return state


def create_app(backend: ServeBackend, *, token: str = "", max_body_bytes: int = 8 << 20,
               max_weights_bytes: int = 16 << 30, max_request_sequences: int = 1024,
               max_client_sequences: int = 16384) -> Any:
    """The ASGI app (Starlette behind the token guard)."""
    h = _Handlers(backend, max_body_bytes, max_weights_bytes,
                  max_request_sequences=max_request_sequences,
                  max_client_sequences=max_client_sequences)

    @asynccontextmanager
    async def lifespan(app):
        yield
        await backend.close()

    async def http_error(request: Request, exc: HTTPException) -> Response:
        h.http[f"errors_{exc.status_code}"] += 1
        return _error(BadRequest(f"{request.method} {request.url.path}: {exc.detail}",
                                 status=exc.status_code))

    routes = [Route("/health", h.health, methods=["GET"]),
              Route("/metrics", h.metrics, methods=["GET"]),
              Route("/v1/models", h.models, methods=["GET"]),
              Route("/v1/models/{model:path}", h.model, methods=["GET"]),
              Route("/v1/completions", h.completions, methods=["POST"]),
              Route("/v1/chat/completions", h.chat, methods=["POST"]),
              Route("/v1/abort", h.abort, methods=["POST"]),
              Route("/v1/weights", h.weights, methods=["POST"])]
    app = Starlette(routes=routes, lifespan=lifespan,
                    exception_handlers={HTTPException: http_error})
    app.state.handlers = h
    return _Guard(app, token, h.http)
