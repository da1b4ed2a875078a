"""OpenAIEngine (``engine.name = "openai"``): the asynchronous `Engine` protocol over HTTP,
against one or several servers (``engine.base_url``) of the kind ``engine.server`` names
(`reroll serve`, vLLM, SGLang: each spoken through its adapter, `reroll.engine.adapters`).

Owns the HTTP client (the only module that imports httpx), the records it fills and how
requests are sent, resumed and aborted; the servers' load, health and weights are its
`reroll.engine.fleet`'s. Behaviour log-probs and versions
are the server's (an adapter stamps tokens with the pushed version where a server reports
none). Knows nothing of any server's routes or JSON (the adapters do), nor of groups'
rewards, trainers or staleness.

- Waves: the requests submitted in one pass of the event loop go out together, each server's
  share tagged as one wave that a `reroll serve` admits at once, as `EngineService` admits a
  batch in process: with per-request seeds, a run through `reroll serve` equals the
  in-process run bitwise.
- Load: each prompt's samples go to the live server with the fewest requests in flight (a
  group stays on one server, so its prompt is prefilled once).
- Failover: a server that stops answering (refused connection, broken stream, a 5xx) is
  marked down and its in-flight requests are resumed on another live one from the tokens
  already received (counted in ``failovers``); nothing is lost. A down server is probed again
  after ``revive_s`` and given the latest weights before it serves again.
- Weights: ``update_weights`` pushes to every live server through the adapter (safetensors
  bytes in the body, or a directory under ``weights_dir`` for servers that load from disk).
  A request that a server stops for the push (finish "abort" that reroll did not ask for) is
  sent again from its prefix once the push is done. ``connect`` probes every server before
  the run and refuses one whose weights cannot be updated, saying why.
- ``sync`` has nothing to do: records hold every token received, the moment it arrives.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from reroll.engine.adapters import SERVERS, AdapterError, Ask, Call, Piece, Reply, check
from reroll.engine.fleet import Fleet, Gone, Server
from reroll.engine.weight_files import payload as weights_payload
from reroll.rollout import Rollout

Turn = tuple[int, int]


@dataclass(eq=False)
class _Job:
    rollout: Rollout
    turn: Turn | None
    future: asyncio.Future
    server: Server | None = None
    task: asyncio.Task | None = None
    aborting: bool = False
    sending: bool = False  # a request of it is with a server now
    attempt: int = 0
    version: int = 0


class OpenAIEngine:
    def __init__(self, base_url: str | list[str], *, server: str = "reroll", api_key: str = "",
                 tokenizer: Any = None, version: int = 0, timeout_s: float = 600.0,
                 weights_dir: str = "", model_config: Any = None, revive_s: float = 5.0):
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        self.adapter = SERVERS.get(server)()
        self.fleet = Fleet(urls, self.adapter, self._send, timeout_s=timeout_s,
                           revive_s=revive_s)
        self.servers = self.fleet.servers
        self.version, self.tok, self.timeout_s = version, tokenizer, timeout_s
        self.api_key = api_key or os.environ.get("REROLL_API_KEY", "")
        self.weights_dir, self.model_config = weights_dir, model_config
        self.counts = dict.fromkeys(
            ["tokens_generated", "requests_added", "requests_finished", "requests_aborted",
             "requests_resumed", "weight_pushes", "time_push_s"], 0.0)
        self._jobs: dict[str, _Job] = {}
        self._wave: list[_Job] = []
        self._loop = self._client = self._ready = None
        self._busy_s, self._busy_since = 0.0, None

    # ---- before the run: probe, refuse, first weights -----------------------------------
    def connect(self, weights: Any = None, *, need_updates: bool = False) -> None:
        """Probe every server (a ConfigError names one that does not answer, or, with
        ``need_updates``, one whose weights cannot be updated, and why) and push
        ``weights`` as the current version. Runs before the run's event loop exists."""
        asyncio.run(self._connect(weights, need_updates))

    async def _connect(self, weights: Any, need_updates: bool) -> None:
        self._bind()
        try:
            await self.fleet.check(need_updates, self._disk_problem())
            if weights is not None:
                await self.update_weights(weights, self.version)
        finally:
            await self._client.aclose()
            self._loop = self._client = None

    def _disk_problem(self) -> str | None:
        if self.adapter.takes_bytes or self.weights_dir:
            return None
        return (f"a {self.fleet.kind} server loads new weights from disk: set "
                f"engine.weights_dir to a directory it can read")

    # ---- the Engine protocol --------------------------------------------------------------
    def generate(self, rollout: Rollout, turn: Turn | None = None) -> asyncio.Future:
        loop = self._bind()
        sid = rollout.sample_id
        if sid in self._jobs:
            raise ValueError(f"rollout {sid} is already being generated")
        job = _Job(rollout, turn, loop.create_future())
        self._jobs[sid] = job
        if self._busy_since is None:
            self._busy_since = time.perf_counter()
        rollout.finish = "running"
        if rollout.start_version < 0:
            rollout.start_version = self.version
        rollout.timings["engine_add"] = time.time()
        self.counts["requests_added"] += 1
        self._wave.append(job)
        if len(self._wave) == 1:  # after every task woken in this pass has submitted
            loop.call_soon(self._flush)
        return job.future

    async def update_weights(self, weights: Any, version: int, interrupt: bool = True) -> None:
        self._bind()
        async with self.fleet.lock:
            self._ready.clear()  # a request the push stops waits for the new weights
            t0 = time.perf_counter()
            try:
                payload = await asyncio.to_thread(
                    weights_payload, weights, version, self.weights_dir,
                    in_place=self.adapter.in_place, model_config=self.model_config)
                await self.fleet.push(payload, interrupt)
                self.version = int(version)
                self.counts["weight_pushes"] += 1
            finally:
                self.counts["time_push_s"] += time.perf_counter() - t0
                self._ready.set()

    async def abort(self, sample_ids: list[str] | None = None) -> list[Rollout]:
        wanted = None if sample_ids is None else set(sample_ids)
        jobs = [j for sid, j in list(self._jobs.items()) if wanted is None or sid in wanted]
        for j in jobs:
            j.aborting = True
            if j in self._wave:  # not sent yet: nothing sampled in this call
                self._wave.remove(j)
                self._finish(j, "abort")
        sent = [j for j in jobs if j.task is not None and not j.future.done()]
        for j in sent:  # between requests (waiting for weights or a server): stop it now
            if not j.sending:
                j.task.cancel()
        for _ in range(20):  # a request still on the wire may miss the first abort
            by_server: dict[Server, list[_Job]] = {}
            for j in sent:
                if not j.future.done() and j.server is not None:
                    by_server.setdefault(j.server, []).append(j)
            for s, js in by_server.items():
                calls = self.adapter.abort([f"{j.rollout.sample_id}-{j.attempt}" for j in js])
                if not calls:  # closing the connection aborts (vLLM)
                    for j in js:
                        j.task.cancel()
                for c in calls:
                    try:
                        await self._send(s, c)
                    except Gone:
                        pass  # the request's own stream sees the server go and keeps its prefix
            pending = [j.task for j in sent if not j.future.done() and not j.task.done()]
            if pending:
                await asyncio.wait(pending, timeout=0.25)
            if all(j.future.done() or j.task.done() for j in sent):
                break
        for j in sent:  # cancelled, or still running after every try: stop it here
            if not j.future.done():
                j.task.cancel()
                await asyncio.gather(j.task, return_exceptions=True)
                self._finish(j, "abort")
        return [j.rollout for j in jobs]

    async def sync(self) -> None:
        """Nothing to do: every token received is in its record already."""

    def stats(self) -> dict[str, float]:
        s = dict(self.counts)
        busy = self._busy_s + (time.perf_counter() - self._busy_since
                               if self._busy_since is not None else 0.0)
        s.update(self.fleet.counts, time_decode_s=busy, version=float(self.version),
                 running=float(len(self._jobs)),
                 servers_alive=float(sum(x.alive for x in self.servers)))
        return s

    async def close(self) -> None:
        tasks = [j.task for j in self._jobs.values() if j.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    # ---- sending --------------------------------------------------------------------------
    def _bind(self) -> asyncio.AbstractEventLoop:
        """The HTTP client and asyncio objects belong to the loop that uses them."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop = loop
            self._ready = asyncio.Event()
            self._ready.set()
            self.fleet.bind()
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_s, connect=10.0), headers=headers,
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=1024))
        return loop

    async def _send(self, s: Server, call: Call) -> Reply:
        try:
            resp = await self._client.request(call.method, s.url + call.path, json=call.json,
                                              content=call.content, params=call.params,
                                              headers=call.headers or None)
        except httpx.TransportError as e:
            raise Gone(f"{s.url}: {type(e).__name__}: {e}") from e
        try:
            data = resp.json()
        except ValueError:
            data = resp.text
        return Reply(resp.status_code, data)

    # ---- requests -------------------------------------------------------------------------
    def _flush(self) -> None:
        jobs, self._wave = [j for j in self._wave if not j.future.done()], []
        if not jobs:
            return
        self.fleet.revive_later()
        for s, mine in self.fleet.assign(jobs):
            wid = uuid.uuid4().hex if self.adapter.waves and len(mine) > 1 else None
            for i, j in enumerate(mine):
                self._enter(j, s)
                j.task = self._loop.create_task(
                    self._run(j, (wid, len(mine), i) if wid else None))

    def _enter(self, job: _Job, s: Server) -> None:
        job.server = s
        s.in_flight += 1

    def _leave(self, job: _Job) -> None:
        if job.server is not None:
            job.server.in_flight -= 1
            job.server = None

    async def _run(self, job: _Job, wave: tuple[str, int, int] | None) -> None:
        try:
            while True:
                await self._ready.wait()
                try:
                    job.sending = True
                    finish = await self._attempt(job, wave)
                except Gone:
                    job.sending = False
                    self.fleet.down(job.server)
                    if not job.aborting:
                        wave = None
                        self._leave(job)
                        self._enter(job, await self.fleet.elsewhere())
                        continue
                    finish = "abort"
                finally:
                    job.sending = False
                if finish == "abort" and not job.aborting:  # stopped by the server (a push)
                    wave = None
                    continue
                self._finish(job, finish)
                return
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a refused request or a broken reply: this request fails
            self._leave(job)
            self._jobs.pop(job.rollout.sample_id, None)
            if not job.future.done():
                job.future.set_exception(RuntimeError(
                    f"OpenAIEngine: rollout {job.rollout.sample_id}: {e}"))

    async def _attempt(self, job: _Job, wave: tuple[str, int, int] | None) -> str:
        r, s = job.rollout, job.server
        start, end = job.turn or (r.prompt_len, r.prompt_len + r.sampling.max_new_tokens)
        if s.context is not None:
            if len(r.tokens) >= s.context:
                raise ValueError(f"{len(r.tokens)} tokens leave no room in the context of "
                                 f"{s.context} tokens of {s.url}")
            end = min(end, s.context)
        if len(r.tokens) >= end:  # nothing left to sample (as the engine finishes it)
            return "length"
        job.version, job.attempt = self.version, job.attempt + 1
        if len(r.tokens) > start and not self.adapter.streams:
            r.resume_count += 1  # a re-prefill of sampled tokens (a streaming server counts)
            self.counts["requests_resumed"] += 1
        call = self.adapter.generate(Ask(r, start, end, f"{r.sample_id}-{job.attempt}",
                                         s.model, wave))
        if self.adapter.streams:
            return await self._stream(job, s, call)
        reply = await self._send(s, call)
        if reply.status >= 500:
            raise Gone(f"{s.url}: HTTP {reply.status}: {reply.data}")
        piece = self.adapter.parse(check(reply, f"{call.method} {call.path}"))
        self._apply(job, piece)
        return piece.finish or "stop"

    async def _stream(self, job: _Job, s: Server, call: Call) -> str:
        finish = None
        try:
            async with self._client.stream(call.method, s.url + call.path, json=call.json,
                                           headers=call.headers or None) as resp:
                if resp.status_code != 200:
                    raw = (await resp.aread()).decode(errors="replace")
                    try:
                        data = json.loads(raw)
                    except ValueError:
                        data = raw
                    if resp.status_code >= 500:
                        raise Gone(f"{s.url}: HTTP {resp.status_code}: {data}")
                    check(Reply(resp.status_code, data), f"{call.method} {call.path}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        piece = self.adapter.parse(json.loads(payload))
                    except AdapterError as e:  # the server's engine failed: go elsewhere
                        raise Gone(f"{s.url}: {e}") from e
                    self._apply(job, piece)
                    finish = piece.finish or finish
        except httpx.TransportError as e:
            raise Gone(f"{s.url}: {type(e).__name__}: {e}") from e
        if finish is None:
            raise Gone(f"{s.url}: the response ended before the request finished")
        return finish

    def _apply(self, job: _Job, piece: Piece) -> None:
        n = len(piece.tokens)
        if len(piece.logprobs) != n or (piece.versions is not None and len(piece.versions) != n):
            raise AdapterError(f"{n} tokens came with {len(piece.logprobs)} log-probs and "
                               f"{'no' if piece.versions is None else len(piece.versions)} "
                               f"versions")
        r = job.rollout
        versions = piece.versions if piece.versions is not None else [job.version] * n
        for t, lp, v in zip(piece.tokens, piece.logprobs, versions):
            r.append(int(t), float(lp), int(v))
        self.counts["tokens_generated"] += n
        if piece.finish and piece.resumes:
            r.resume_count += piece.resumes
            self.counts["requests_resumed"] += piece.resumes

    def _finish(self, job: _Job, finish: str) -> None:
        self._leave(job)
        r = job.rollout
        self._jobs.pop(r.sample_id, None)
        if not self._jobs and self._busy_since is not None:
            self._busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None
        r.finish = finish
        r.completion = self.tok.decode(r.response_tokens, skip_special_tokens=True) \
            if self.tok is not None else ""
        r.timings["engine_finish"] = time.time()
        self.counts["requests_aborted" if finish == "abort" else "requests_finished"] += 1
        if not job.future.done():
            job.future.set_result(r)
