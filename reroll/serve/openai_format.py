"""OpenAI's response shapes for what the engine sampled: completion and chat-completion
bodies, their streamed chunks, errors.

Owns the JSON layout only (pure functions). Besides OpenAI's fields every choice carries the
sampled ``token_ids``, the per-token policy ``versions`` and, once finished, ``resumes`` (how
often the request was re-prefilled: a weight update or a resume of sampled tokens), and every
body the server's ``policy_version``; with ``logprobs`` asked for, each token's behaviour
log-prob under the distribution actually sampled from (`reroll.engine.sampling`). Knows
nothing of HTTP or engines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from reroll.rollout import Rollout


@dataclass
class Part:
    """Tokens of one request sampled since its last chunk (a consistent prefix: the engine
    appends versions last, so the first ``len(versions)`` entries of each list exist)."""

    tokens: list[int]
    logprobs: list[float]
    versions: list[int]


def take(r: Rollout, start: int, sent: int) -> Part:
    """The tokens of ``r`` from ``start + sent`` on."""
    n = len(r.versions)
    lo = min(start + sent, n)
    return Part(r.tokens[lo:n], r.logprobs[lo:n], r.versions[lo:n])


def error_body(message: str, status: int, param: str | None = None,
               code: str | None = None) -> dict:
    kind = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
            409: "conflict_error", 413: "invalid_request_error"}.get(status, "invalid_request_error"
                                                                    if status < 500 else
                                                                    "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _token_texts(tok: Any, ids: list[int], as_ids: bool) -> list[str]:
    if as_ids:
        return [f"token_id:{t}" for t in ids]
    return [tok.decode([t]) for t in ids]


def completion_choice(index: int, tok: Any, part: Part, text: str, finish: str | None, *,
                      logprobs: bool, as_ids: bool, resumes: int | None) -> dict:
    lp = None
    if logprobs:
        texts = _token_texts(tok, part.tokens, as_ids)
        offsets, at = [], 0
        for t in texts:
            offsets.append(at)
            at += len(t)
        lp = {"tokens": texts, "token_logprobs": part.logprobs, "top_logprobs": None,
              "text_offset": offsets}
    out = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish,
           "token_ids": part.tokens, "versions": part.versions}
    if resumes is not None:
        out["resumes"] = resumes
    return out


def chat_choice(index: int, tok: Any, part: Part, text: str, finish: str | None, *,
                logprobs: bool, delta: bool, first: bool, resumes: int | None) -> dict:
    lp = None
    if logprobs:
        lp = {"content": [{"token": s, "logprob": v, "bytes": list(s.encode()),
                           "top_logprobs": []}
                          for s, v in zip(_token_texts(tok, part.tokens, False), part.logprobs)]}
    msg: dict[str, Any] = {"role": "assistant", "content": text}
    if delta and not first:
        msg = {"content": text}
    out = {"index": index, ("delta" if delta else "message"): msg, "logprobs": lp,
           "finish_reason": finish, "token_ids": part.tokens, "versions": part.versions}
    if resumes is not None:
        out["resumes"] = resumes
    return out


def body(rid: str, model: str, choices: list[dict], version: int, *, chat: bool, chunk: bool,
         usage: dict | None = None) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    out = {"id": ("chatcmpl-" if chat else "cmpl-") + rid, "object": kind,
           "created": int(time.time()), "model": model, "choices": choices,
           "policy_version": version}
    if usage is not None:
        out["usage"] = usage
    return out


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def prometheus(stats: dict[str, float], http: dict[str, float]) -> str:
    """Counters as Prometheus text: ``reroll_engine_<name>`` and ``reroll_http_<name>``."""
    lines = [f"reroll_engine_{k} {float(v)!r}" for k, v in sorted(stats.items())]
    lines += [f"reroll_http_{k} {float(v)!r}" for k, v in sorted(http.items())]
    return "\n".join(lines) + "\n"
