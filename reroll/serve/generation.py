"""Generation requests of `reroll serve`: prompts (text, token ids, or chat messages rendered
by the tokenizer's template) become engine jobs with the request's sampling (``seed + k``
for choice ``k``; the stop ids, EOS included unless ``ignore_eos``; reroll's ``sampled``,
``stop_rule`` and wave), and finished or streaming jobs become OpenAI responses.

Owns that translation and the bounds on the work a request and a client may queue: a
request of more than ``max_request_sequences`` sequences (prompts x ``n``) is refused (400),
and one that would take a client (its address) past ``max_client_sequences`` sequences queued
or running is refused with 429 until some finish. Knows nothing of HTTP routing, bearer
tokens or body limits (`reroll.serve.app`) nor of the engine's thread
(`reroll.serve.backend`)."""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections import Counter
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse

from reroll.rollout import SamplingParams, StopRule
from reroll.serve import openai_format as fmt
from reroll.serve.backend import Job, ServeBackend
from reroll.serve.schemas import BadRequest, ChatRequest


class Generation:
    def __init__(self, backend: ServeBackend, *, max_request_sequences: int = 1024,
                 max_client_sequences: int = 16384):
        self.b = backend
        self.max_request, self.max_client = max_request_sequences, max_client_sequences
        self.queued: Counter[str] = Counter()  # sequences queued or running, per client

    def _bound(self, count: int, client: str) -> None:
        if count > self.max_request:
            raise BadRequest(f"prompts x n = {count} sequences exceed this server's limit of "
                             f"{self.max_request} per request (reroll serve "
                             f"--max-request-sequences)", param="n", code="too_many_sequences")
        if self.queued[client] + count > self.max_client:
            raise BadRequest(f"this client has {self.queued[client]} sequences queued or "
                             f"running; {count} more exceed the limit of {self.max_client} per "
                             f"client (reroll serve --max-client-sequences): retry when some "
                             f"finish", status=429, code="rate_limit_exceeded")

    def _done(self, client: str, _: asyncio.Future) -> None:
        self.queued[client] -= 1
        if self.queued[client] <= 0:
            del self.queued[client]

    # ---- requests -> jobs ---------------------------------------------------------------
    def ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            from reroll.build_rollout import encode_prompt

            return encode_prompt(self.b.tok)(prompt)
        return list(prompt)

    def chat_ids(self, req: ChatRequest) -> list[int]:
        if not getattr(self.b.tok, "chat_template", None):
            raise BadRequest("this model's tokenizer has no chat template; use /v1/completions")
        try:
            return list(self.b.tok.apply_chat_template(
                [m.model_dump(exclude_none=True) for m in req.messages], tokenize=True,
                add_generation_prompt=True, return_dict=False))
        except Exception as e:  # the template's own errors (roles, missing fields)
            raise BadRequest(f"the chat template cannot render these messages: {e}") from None

    async def submit(self, rid: str | None, req: Any, prompts: list[list[int]],
                     max_tokens: int | None, client: str = "") -> list[Job]:
        """One engine job per prompt and choice (``rid``, or ``rid-k`` when there are
        several); all or none: a job that is refused stops the ones already submitted."""
        self._bound(len(prompts) * req.n, client)
        rid = rid or uuid.uuid4().hex
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
                self.queued[client] += 1
                jobs[-1].done.add_done_callback(functools.partial(self._done, client))
        except BadRequest:
            await self.b.abort([j.rid for j in jobs])
            raise
        return jobs

    async def respond(self, rid: str | None, req: Any, prompts: list[list[int]],
                      max_tokens: int | None, chat: bool, client: str = "") -> Response:
        """The whole response once every job finished, or (``stream``) server-sent events."""
        jobs = await self.submit(rid, req, prompts, max_tokens, client)
        if req.stream:
            return StreamingResponse(self.events(jobs, req, chat), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            await asyncio.gather(*(j.done for j in jobs))
        except (RuntimeError, ValueError) as e:
            raise BadRequest(f"generation failed: {e}", status=503) from None
        choices = []
        for i, j in enumerate(jobs):
            r = j.rollout
            part = fmt.take(r, j.start, 0)
            choices.append(self.choice(i, part, self.text(part.tokens), r.finish, req, chat,
                                        first=True, resumes=r.resume_count, delta=False))
        n_out = sum(len(c["token_ids"]) for c in choices)
        use = fmt.usage(sum(j.start for j in jobs), n_out)
        return JSONResponse(fmt.body(jobs[0].rid, self.b.model_name, choices, self.b.version,
                                     chat=chat, chunk=False, usage=use))

    def text(self, ids: list[int]) -> str:
        return self.b.tok.decode(ids, skip_special_tokens=True)

    def choice(self, i: int, part: fmt.Part, text: str, finish: str | None, req: Any,
                chat: bool, *, first: bool, resumes: int | None, delta: bool) -> dict:
        if chat:
            return fmt.chat_choice(i, self.b.tok, part, text, finish, logprobs=req.logprobs,
                                   delta=delta, first=first, resumes=resumes)
        return fmt.completion_choice(i, self.b.tok, part, text, finish,
                                     logprobs=req.logprobs is not None,
                                     as_ids=req.return_tokens_as_token_ids, resumes=resumes)

    async def events(self, jobs: list[Job], req: Any, chat: bool):
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
                    full = self.text(j.rollout.tokens[j.start:j.start + sent[i]
                                                       + len(part.tokens)])
                    delta = full[len(texts[i]):] if full.startswith(texts[i]) else full
                    r = j.rollout
                    choice = self.choice(i, part, delta, r.finish if fin else None, req, chat,
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


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


