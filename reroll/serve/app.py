"""The HTTP face of `reroll serve`: an OpenAI-compatible Starlette app over a `ServeBackend`.

Routes: ``POST /v1/completions`` (prompt as text or token ids, one or several; token ids,
per-token behaviour log-probs and policy versions back; ``seed`` honoured per request),
``POST /v1/chat/completions`` (messages rendered by the tokenizer's chat template),
``GET /v1/models``, ``POST /v1/abort`` (by request id), ``POST /v1/weights`` (safetensors
bytes with ``?version=N``, or JSON ``{"path", "version"}``), ``GET /health`` and ``GET
/metrics`` (Prometheus text; ``?format=json`` for JSON). ``stream: true`` answers with
server-sent events as tokens are sampled.

Owns request handling: an optional bearer token (every route but ``/health``), body size
limits, and errors as OpenAI error objects with a 4xx status and a reason; nothing a client
sends can stop the server. Knows nothing of the engine's internals (`reroll.serve.backend`
does) and formats through `reroll.serve.openai_format`.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import uuid
from collections import Counter
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from reroll.rollout import SamplingParams, StopRule
from reroll.serve import openai_format as fmt
from reroll.serve.backend import Job, ServeBackend
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
    def __init__(self, backend: ServeBackend, max_body: int, max_weights: int):
        self.b, self.max_body, self.max_weights = backend, max_body, max_weights
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

    # ---- generation -------------------------------------------------------------------------
    def _ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            from reroll.build import encode_prompt

            return encode_prompt(self.b.tok)(prompt)
        return list(prompt)

    def _chat_ids(self, req: ChatRequest) -> list[int]:
        if not getattr(self.b.tok, "chat_template", None):
            raise BadRequest("this model's tokenizer has no chat template; use /v1/completions")
        try:
            return list(self.b.tok.apply_chat_template(
                [m.model_dump(exclude_none=True) for m in req.messages], tokenize=True,
                add_generation_prompt=True, return_dict=False))
        except Exception as e:  # the template's own errors (roles, missing fields)
            raise BadRequest(f"the chat template cannot render these messages: {e}") from None

    async def _submit(self, request: Request, req: Any, prompts: list[list[int]],
                      max_tokens: int | None) -> list[Job]:
        rid = req.request_id or request.headers.get("x-request-id") or uuid.uuid4().hex
        multi = len(prompts) * req.n > 1
        ext = req.reroll
        if ext.wave is not None and multi:
            raise BadRequest("reroll.wave needs one prompt and n = 1", param="reroll.wave")
        rule = None
        if ext.stop_rule is not None:
            try:
                rule = StopRule(**ext.stop_rule.model_dump())
            except ValueError as e:
                raise BadRequest(f"reroll.stop_rule: {e}") from None
        stops = list(req.stop_token_ids) + ([] if req.ignore_eos else self.b.eos_ids())
        wave = None if ext.wave is None else (ext.wave, ext.wave_size, ext.wave_index)
        jobs: list[Job] = []
        try:
            for k, ids in enumerate(p for p in prompts for _ in range(req.n)):
                n_new = self.b.context - len(ids) if max_tokens is None else max_tokens
                sp = SamplingParams(temperature=req.temperature, top_p=req.top_p,
                                    top_k=max(0, req.top_k), max_new_tokens=max(0, n_new),
                                    stop_token_ids=stops, stop_strings=req.stop_strings,
                                    seed=None if req.seed is None else req.seed + k,
                                    stop_rule=rule)
                jobs.append(self.b.submit(f"{rid}-{k}" if multi else rid, ids, ext.sampled,
                                          max(0, n_new), sp, wave))
        except BadRequest:
            await self.b.abort([j.rid for j in jobs])
            raise
        return jobs

    async def _generate(self, request: Request, req: Any, prompts: list[list[int]],
                        max_tokens: int | None, chat: bool) -> Response:
        jobs = await self._submit(request, req, prompts, max_tokens)
        if req.stream:
            return StreamingResponse(self._events(jobs, req, chat), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            await asyncio.gather(*(j.done for j in jobs))
        except (RuntimeError, ValueError) as e:
            raise BadRequest(f"generation failed: {e}", status=503) from None
        choices = []
        for i, j in enumerate(jobs):
            r = j.rollout
            part = fmt.take(r, j.start, 0)
            choices.append(self._choice(i, part, self._text(part.tokens), r.finish, req, chat,
                                        first=True, resumes=r.resume_count, delta=False))
        n_out = sum(len(c["token_ids"]) for c in choices)
        use = fmt.usage(sum(j.start for j in jobs), n_out)
        return JSONResponse(fmt.body(jobs[0].rid, self.b.model_name, choices, self.b.version,
                                     chat=chat, chunk=False, usage=use))

    def _text(self, ids: list[int]) -> str:
        return self.b.tok.decode(ids, skip_special_tokens=True)

    def _choice(self, i: int, part: fmt.Part, text: str, finish: str | None, req: Any,
                chat: bool, *, first: bool, resumes: int | None, delta: bool) -> dict:
        if chat:
            return fmt.chat_choice(i, self.b.tok, part, text, finish, logprobs=req.logprobs,
                                   delta=delta, first=first, resumes=resumes)
        return fmt.completion_choice(i, self.b.tok, part, text, finish,
                                     logprobs=req.logprobs is not None,
                                     as_ids=req.return_tokens_as_token_ids, resumes=resumes)

    async def _events(self, jobs: list[Job], req: Any, chat: bool):
        """Server-sent events: a chunk per request whenever it has new tokens (flushed every
        stream interval), its last chunk with the finish reason, then ``[DONE]``."""
        sent, texts, done = [0] * len(jobs), [""] * len(jobs), [False] * len(jobs)
        self.b.streaming(+1)
        try:
            while not all(done):
                await self.b.next_tick([j.done for j, d in zip(jobs, done) if not d])
                for i, j in enumerate(jobs):
                    if done[i]:
                        continue
                    fin = j.done.done()
                    if fin and j.done.exception() is not None:
                        raise j.done.exception()
                    part = fmt.take(j.rollout, j.start, sent[i])
                    if not part.tokens and not fin:
                        continue
                    full = self._text(j.rollout.tokens[j.start:j.start + sent[i]
                                                       + len(part.tokens)])
                    delta = full[len(texts[i]):] if full.startswith(texts[i]) else full
                    r = j.rollout
                    choice = self._choice(i, part, delta, r.finish if fin else None, req, chat,
                                          first=sent[i] == 0, delta=True,
                                          resumes=r.resume_count if fin else None)
                    sent[i] += len(part.tokens)
                    texts[i], done[i] = full, fin
                    yield _sse(fmt.body(j.rid, self.b.model_name, [choice], self.b.version,
                                        chat=chat, chunk=True))
            if (req.stream_options or {}).get("include_usage"):
                use = fmt.usage(sum(j.start for j in jobs), sum(sent))
                yield _sse(fmt.body(jobs[0].rid, self.b.model_name, [], self.b.version,
                                    chat=chat, chunk=True, usage=use))
            yield "data: [DONE]\n\n"
        except (RuntimeError, ValueError) as e:
            yield _sse(fmt.error_body(f"generation failed: {e}", 503))
        finally:
            self.b.streaming(-1)
            left = [j.rid for j, d in zip(jobs, done) if not d and not j.done.done()]
            if left:  # the client went away: stop sampling for it
                asyncio.get_running_loop().create_task(self.b.abort(left))

    # ---- routes -----------------------------------------------------------------------------
    @_route
    async def completions(self, request: Request) -> Response:
        req = parse(CompletionRequest, await self._json(request))
        self._model(req.model)
        prompts = [self._ids(p) for p in req.prompts()]
        return await self._generate(request, req, prompts, req.max_tokens, chat=False)

    @_route
    async def chat(self, request: Request) -> Response:
        req = parse(ChatRequest, await self._json(request))
        self._model(req.model)
        limit = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        return await self._generate(request, req, [self._chat_ids(req)], limit, chat=True)

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


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


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
               max_weights_bytes: int = 16 << 30) -> Any:
    """The ASGI app (Starlette behind the token guard)."""
    h = _Handlers(backend, max_body_bytes, max_weights_bytes)

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
