"""What `OpenAIEngine` asks of a kind of server, and the ``SERVERS`` registry
(``engine.server``): one adapter per server (`reroll_adapter`: reroll serve; `vllm_adapter`;
`sglang_adapter`), each the only module that knows that server's request and response
shapes, its log-prob and version conventions and its weight-update routes.

Adapters build requests (`Call`) and read responses (`Piece`); they send nothing themselves
(the engine owns the HTTP client and hands a `Http` to `push`), so no adapter imports an
HTTP library. Knows nothing of scheduling, failover or the records' bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from reroll.registry import Registry
from reroll.rollout import Rollout

SERVERS = Registry("server")
"""name -> adapter class (no arguments)."""


class AdapterError(RuntimeError):
    """A server answered, but not as its adapter expects (a refused update, a bad body)."""


@dataclass
class Call:
    """One HTTP request: ``json`` or raw ``content`` as the body."""

    method: str
    path: str
    json: Any = None
    content: bytes | None = None
    params: dict[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Reply:
    status: int
    data: Any  # the decoded JSON body, or the text when it is not JSON


@dataclass
class Ask:
    """One generation request: sample into ``rollout`` from ``start`` (the first index this
    call samples; tokens after it were sampled before: a resume) up to length ``end``."""

    rollout: Rollout
    start: int
    end: int
    request_id: str
    model: str | None = None
    wave: tuple[str, int, int] | None = None  # (id, size, index): submitted together


@dataclass
class Piece:
    """What one response, or one streamed event, adds to the record."""

    tokens: list[int]
    logprobs: list[float]
    versions: list[int] | None  # per token; None: the server reports none
    finish: str | None  # set on the last piece of a request
    resumes: int | None = None  # re-prefills the server counted (None: it does not count)


@dataclass
class Weights:
    """A weight push: tensors as safetensors bytes, or a path the server can read."""

    version: int
    data: bytes | None = None
    path: str | None = None


class Http(Protocol):
    async def send(self, call: Call) -> Reply: ...


class Adapter(Protocol):
    streams: bool  # responses are server-sent events with tokens as they are sampled
    versions: bool  # responses carry a policy version per token
    waves: bool  # the server admits a wave of requests together (bitwise equal batching)
    takes_bytes: bool  # weights can be pushed as tensors in the request body
    in_place: bool  # a path push overwrites the directory the server was started from

    def generate(self, ask: Ask) -> Call: ...

    def parse(self, data: Any) -> Piece: ...

    def abort(self, request_ids: list[str]) -> list[Call]:
        """Calls that stop these requests (none: closing the connection stops them)."""
        ...

    def probe(self) -> Call: ...

    def inspect(self, reply: Reply) -> dict[str, Any]:
        """From the probe's reply: ``updatable`` (None, or why the server cannot take new
        weights), and where known ``model`` and ``context`` (tokens)."""
        ...

    async def push(self, http: Http, weights: Weights, interrupt: bool) -> None: ...


def check(reply: Reply, what: str) -> Any:
    """The reply's data, or an `AdapterError` naming ``what`` and the server's reason."""
    if reply.status != 200:
        msg = reply.data
        if isinstance(msg, dict):
            msg = (msg.get("error") or {}).get("message") if isinstance(msg.get("error"),
                                                                         dict) else msg
        raise AdapterError(f"{what}: HTTP {reply.status}: {msg}")
    return reply.data


def sampled(ask: Ask) -> int:
    """Tokens of this call sampled before it (a resume re-prefills them)."""
    return len(ask.rollout.tokens) - ask.start
