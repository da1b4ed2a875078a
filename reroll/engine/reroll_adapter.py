"""`engine.server = "reroll"`: `reroll serve` (`reroll.serve`), the only module of the engine
that knows its routes and extensions.

Generation streams from ``POST /v1/completions`` with the whole sequence as token ids, the
record's sampling (seed included; ``ignore_eos`` with the record's own stop ids, so the stop
set is exactly the record's), and reroll's ``reroll`` object: ``sampled`` for a resume, the
control policy's ``stop_rule`` and the *wave* the request was submitted in (the server admits
a wave together, as the in-process engine admits a batch). Every chunk carries the sampled
token ids, their behaviour log-probs (``logprobs: 0``) and their policy versions; the last
one how often the server re-prefilled the request (``resumes``). Weights go to
``POST /v1/weights`` as safetensors bytes (``?version=N``) or as a path, and the server
aborts, swaps and resumes its in-flight requests itself (``interrupt``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from reroll.engine.adapters import (
    SERVERS,
    AdapterError,
    Ask,
    Call,
    Http,
    Piece,
    Reply,
    Weights,
    check,
    sampled,
)


@SERVERS.register("reroll")
class RerollServer:
    """`reroll serve`: streamed token ids, behaviour log-probs and versions; weights as tensors or a path; waves."""

    streams, versions, waves, takes_bytes, in_place = True, True, True, True, False

    def generate(self, ask: Ask) -> Call:
        r, s = ask.rollout, ask.rollout.sampling
        ext: dict[str, Any] = {"sampled": sampled(ask)}
        if s.stop_rule is not None:
            ext["stop_rule"] = {**asdict(s.stop_rule), "marker": list(s.stop_rule.marker)}
        if ask.wave is not None:
            ext.update(wave=ask.wave[0], wave_size=ask.wave[1], wave_index=ask.wave[2])
        body = {"prompt": list(r.tokens), "max_tokens": ask.end - len(r.tokens),
                "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k,
                "seed": s.seed, "stop_token_ids": list(s.stop_token_ids),
                "stop": list(s.stop_strings) or None, "ignore_eos": True, "logprobs": 0,
                "return_tokens_as_token_ids": True, "stream": True,
                "request_id": ask.request_id, "reroll": ext}
        if ask.model:
            body["model"] = ask.model
        return Call("POST", "/v1/completions", json=body)

    def parse(self, data: Any) -> Piece:
        if "error" in data:
            raise AdapterError(f"the server stopped the request: {data['error']}")
        c = data["choices"][0]
        return Piece(list(c["token_ids"]), list((c.get("logprobs") or {}).get(
            "token_logprobs") or []), list(c["versions"]), c["finish_reason"], c.get("resumes"))

    def abort(self, request_ids: list[str]) -> list[Call]:
        return [Call("POST", "/v1/abort", json={"request_ids": request_ids})]

    def probe(self) -> Call:
        return Call("GET", "/health")

    def inspect(self, reply: Reply) -> dict[str, Any]:
        d = check(reply, "GET /health")
        why = None if d.get("weight_updates") else "it was started with --no-weight-updates"
        return {"updatable": why, "model": d.get("model"), "context": d.get("context")}

    async def push(self, http: Http, weights: Weights, interrupt: bool) -> None:
        if weights.data is not None:
            call = Call("POST", "/v1/weights", content=weights.data,
                        params={"version": str(weights.version),
                                "interrupt": str(interrupt).lower()},
                        headers={"content-type": "application/octet-stream"})
        else:
            call = Call("POST", "/v1/weights", json={"path": weights.path,
                                                     "version": weights.version,
                                                     "interrupt": interrupt})
        check(await http.send(call), f"weights of version {weights.version}")
