"""The servers behind an `OpenAIEngine`: each one's load, health, context and weights
version; where requests go (a prompt's samples together, on the live server with the fewest
requests in flight), marking a server down, waiting for a live one, probing a down server
again and bringing it up to the latest weights before it serves, pushing weights to all,
and the checks before a run (probe, refusal, model name).

Sends through the coroutine it is given (the engine's HTTP client), so it imports no HTTP
library; a server's routes and replies are its adapter's business. Knows nothing of the
records a request fills.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from reroll.engine.adapters import Adapter, AdapterError, Call, Reply, Weights
from reroll.errors import ConfigError


class Gone(Exception):
    """The server did not answer, or broke off: fail over."""


@dataclass(eq=False)
class Server:
    url: str
    index: int
    in_flight: int = 0
    alive: bool = True
    version: int = -1  # of the weights it holds (-1: not pushed by this engine)
    retry_at: float = 0.0
    context: int | None = None  # tokens, where the server says
    model: str | None = None


class _OneServer:
    """The `Http` an adapter pushes weights through: one server."""

    def __init__(self, fleet: Fleet, server: Server):
        self.fleet, self.server = fleet, server

    async def send(self, call: Call) -> Reply:
        return await self.fleet.send(self.server, call)


class Fleet:
    def __init__(self, urls: list[str], adapter: Adapter,
                 send: Callable[[Server, Call], Awaitable[Reply]], *, timeout_s: float,
                 revive_s: float):
        self.servers = [Server(u.rstrip("/"), i) for i, u in enumerate(urls)]
        self.adapter, self.send = adapter, send
        self.timeout_s, self.revive_s = timeout_s, revive_s
        self.latest: Weights | None = None
        self.counts = {"failovers": 0.0, "server_failures": 0.0}
        self.lock: asyncio.Lock | None = None  # pushes, one at a time (set by `bind`)
        self._reviving = False

    def bind(self) -> None:
        """A fresh lock for the event loop that now runs the fleet."""
        self.lock = asyncio.Lock()

    @property
    def kind(self) -> str:
        return type(self.adapter).__name__.removesuffix("Server").lower()

    # ---- before a run -------------------------------------------------------------------
    async def check(self, need_updates: bool, disk_problem: str | None) -> None:
        """Probe every server; a ConfigError names one that does not answer or (with
        ``need_updates``) one that cannot take new weights, and why."""
        for s in self.servers:
            try:
                info = self.adapter.inspect(await self.send(s, self.adapter.probe()))
            except (Gone, AdapterError) as e:
                raise ConfigError(f"engine.base_url: {s.url} does not answer as a {self.kind} "
                                  f"server: {e}") from None
            s.model, s.context = info.get("model"), info.get("context")
            s.model = s.model or await self._model_name(s)
            why = info.get("updatable") or disk_problem
            if need_updates and why:
                raise ConfigError(
                    f"engine.base_url: {s.url} cannot take new weights: {why}. A training run "
                    f"pushes the trainer's weights to its engine after every step (and async "
                    f"training samples from them), so it refuses to start.")

    async def _model_name(self, s: Server) -> str | None:
        try:
            reply = await self.send(s, Call("GET", "/v1/models"))
            return reply.data["data"][0]["id"] if reply.status == 200 else None
        except (Gone, KeyError, IndexError, TypeError):
            return None

    # ---- where requests go --------------------------------------------------------------
    def assign(self, jobs: list[Any]) -> list[tuple[Server, list[Any]]]:
        """Each job's server: a group (``job.rollout.group_id``) stays together, on the live
        server with the fewest requests in flight; jobs keep their submission order."""
        live = [s for s in self.servers if s.alive] or self.servers
        load = {s: s.in_flight for s in live}
        where: dict[str, Server] = {}
        for j in jobs:
            g = j.rollout.group_id
            if g not in where:
                where[g] = min(live, key=lambda s: (load[s], s.index))
            load[where[g]] += 1
        return [(s, [j for j in jobs if where[j.rollout.group_id] is s]) for s in live]

    def down(self, s: Server | None) -> None:
        if s is not None and s.alive:
            s.alive, s.retry_at = False, time.monotonic() + self.revive_s
            self.counts["server_failures"] += 1

    async def elsewhere(self) -> Server:
        """The live server with the fewest requests in flight, for a request whose server
        went down (waiting up to ``timeout_s`` for one to come back when none is up)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            live = [s for s in self.servers if s.alive]
            if live:
                self.counts["failovers"] += 1
                return min(live, key=lambda s: (s.in_flight, s.index))
            if time.monotonic() > deadline:
                raise RuntimeError(f"no server answers: {', '.join(s.url for s in self.servers)}")
            await self.revive()
            await asyncio.sleep(0.2)

    def revive_later(self) -> None:
        if not self._reviving and any(not s.alive and s.retry_at <= time.monotonic()
                                      for s in self.servers):
            asyncio.get_running_loop().create_task(self.revive())

    async def revive(self) -> None:
        """Probe down servers whose retry time has come; one that answers gets the latest
        weights before it serves again."""
        if self._reviving:
            return
        self._reviving = True
        try:
            for s in self.servers:
                if s.alive or s.retry_at > time.monotonic():
                    continue
                try:
                    self.adapter.inspect(await self.send(s, self.adapter.probe()))
                    async with self.lock:
                        if self.latest is not None and s.version != self.latest.version:
                            await self._push_one(s, self.latest, True)
                    s.alive = True
                except (Gone, AdapterError):
                    s.retry_at = time.monotonic() + self.revive_s
        finally:
            self._reviving = False

    # ---- weights ------------------------------------------------------------------------
    async def push(self, payload: Weights, interrupt: bool) -> None:
        """To every live server at once (the caller holds ``lock``); a server that does not
        answer is marked down, one that refuses stops the run."""
        live = [s for s in self.servers if s.alive]
        got = await asyncio.gather(*(self._push_one(s, payload, interrupt) for s in live),
                                   return_exceptions=True)
        for s, res in zip(live, got):
            if isinstance(res, Gone):
                self.down(s)
            elif isinstance(res, BaseException):
                raise RuntimeError(f"{s.url} refused the weights of version "
                                   f"{payload.version}: {res}") from res
        if not any(s.alive for s in live):
            raise RuntimeError(f"no server took the weights of version {payload.version}: "
                               f"{', '.join(s.url for s in self.servers)} are down")
        self.latest = payload

    async def _push_one(self, s: Server, payload: Weights, interrupt: bool) -> None:
        await self.adapter.push(_OneServer(self, s), payload, interrupt)
        s.version = payload.version
