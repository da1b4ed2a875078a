"""The request bodies `reroll serve` accepts: OpenAI's completions and chat completions (with
the token-id extensions vLLM also accepts: ``top_k``, ``stop_token_ids``, ``ignore_eos``,
``return_tokens_as_token_ids``), and reroll's own abort and weight-update bodies.

Owns validation: a malformed body is a `BadRequest` naming the field, never an exception the
server did not expect. Values are taken as JSON types, strictly: a number sent as a string
(``"max_tokens": "16"``), a boolean for a number, ``Infinity`` or ``NaN`` are refused, not
coerced. Knows nothing of HTTP, engines or tokenizers.

reroll's client adds one object, ``reroll``, to a completion request: ``sampled`` (how many
trailing prompt tokens this call already sampled: a resume, so the length limit, stop
strings and a stop rule count them), ``stop_rule`` (a control policy's marker gate, see
`reroll.rollout.StopRule`) and a *wave* (``wave``, ``wave_size``, ``wave_index``): requests
its engine submitted together, which the server admits together, in order, as the
in-process engine would (see `reroll.serve.backend`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator


class BadRequest(ValueError):
    """A request the server refuses, with the HTTP status and OpenAI error fields."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class StopRuleSpec(_Body):
    marker: list[int] = Field(min_length=1)
    grace: int = Field(0, ge=0)
    horizon: int = Field(0, ge=0)
    keep: bool = True


class RerollExtension(_Body):
    sampled: int = Field(0, ge=0)
    stop_rule: StopRuleSpec | None = None
    wave: str | None = None
    wave_size: int = Field(1, ge=1, le=65536)
    wave_index: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _index_in_wave(self) -> RerollExtension:
        if self.wave is not None and self.wave_index >= self.wave_size:
            raise ValueError(f"wave_index {self.wave_index} >= wave_size {self.wave_size}")
        return self


class _Sampling(_Body):
    """Fields completions and chat completions share."""

    model: str | None = None
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # vLLM's convention: -1 (or 0) = off
    n: int = Field(1, ge=1, le=1024)
    seed: int | None = Field(None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] = Field(default_factory=list)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    request_id: str | None = Field(None, min_length=1, max_length=128)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    reroll: RerollExtension = Field(default_factory=RerollExtension)

    @model_validator(mode="after")
    def _unsupported(self) -> _Sampling:
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) != 0.0:
                raise ValueError(f"{name} is not supported by reroll serve (the behaviour "
                                 f"log-probs would not be those of the policy); send 0")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported by reroll serve; send {} or null")
        return self

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=0)  # the sampled token's log-prob only
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    return_tokens_as_token_ids: bool = False

    @model_validator(mode="after")
    def _shape(self) -> CompletionRequest:
        if self.prompt == [] or self.prompt == "":
            raise ValueError("prompt is empty")
        if isinstance(self.prompt, list) and any(p in ([], "") for p in self.prompt):
            raise ValueError("prompt holds an empty prompt")
        if self.echo:
            raise ValueError("echo is not supported by reroll serve")
        if self.suffix:
            raise ValueError("suffix is not supported by reroll serve")
        if self.best_of not in (None, self.n):
            raise ValueError("best_of other than n is not supported by reroll serve")
        return self

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: a text or a list of token ids."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=0)


class AbortBody(_Body):
    request_ids: list[str] | None = None
    all: bool = False

    @model_validator(mode="after")
    def _one(self) -> AbortBody:
        if (self.request_ids is None) == (not self.all):
            raise ValueError("give request_ids (a list) or all = true")
        return self


class WeightsPathBody(_Body):
    path: str = Field(min_length=1)
    version: int = Field(ge=0)
    interrupt: bool = True


def parse(cls: type[BaseModel], data: Any) -> Any:
    """``cls`` from decoded JSON, or a `BadRequest` listing every field that is wrong."""
    if not isinstance(data, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(data).__name__}")
    try:
        return cls.model_validate(data)
    except ValidationError as e:
        parts = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "body"
            msg = err["msg"].removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if err["type"] != "extra_forbidden"
                         else f"{loc}: unknown field")
        raise BadRequest("; ".join(parts[:8]), param=str(e.errors()[0]["loc"][0])
                         if e.errors() and e.errors()[0]["loc"] else None) from None
