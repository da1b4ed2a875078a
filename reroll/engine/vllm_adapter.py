"""`engine.server = "vllm"`: vLLM's OpenAI-compatible server, the only module of reroll that
knows its conventions. Written against vLLM's documented request/response shapes and tested
against a stand-in that answers with them; it is not run against a real vLLM here (that needs
a GPU).

- Generation: ``POST /v1/completions`` with the whole sequence as token ids, the record's
  sampling (``top_k`` -1 when off, ``seed``, ``stop_token_ids`` with ``ignore_eos`` so the
  stop set is the record's), ``logprobs: 0`` (the sampled token's log-prob) and
  ``return_tokens_as_token_ids`` (``logprobs.tokens`` read ``"token_id:N"``). A finish
  reason ``"abort"`` means the server stopped the request (a pause for new weights).
- Behaviour log-probs: vLLM reports the raw model's log-probs unless it runs with
  ``--logprobs-mode processed_logprobs`` (after temperature, top-k and top-p), which is the
  distribution it sampled from and what the trainer's importance weights divide by. Start
  it that way; no route shows the mode, so this cannot be checked from here.
- Versions: responses carry none. Every token is stamped with the version reroll last
  pushed before sending the request: a push pauses vLLM with ``mode=abort`` first, so a
  response never spans two versions (a request already on the wire when a push starts is
  the one exception: it may run under the new weights with the old stamp).
- Weights: the dev-mode routes (``VLLM_SERVER_DEV_MODE=1``): ``POST /pause?mode=abort``,
  then ``POST /collective_rpc`` with ``reload_weights`` (the workers reload the model
  directory the server was started from, into which reroll has written the new
  ``model.safetensors``: ``engine.weights_dir`` must be that directory), then ``POST
  /reset_prefix_cache`` and ``POST /resume``. The probe is ``GET /is_paused``, which exists
  only in dev mode.
- Abort: vLLM has no abort route; closing the connection aborts the request.
"""

from __future__ import annotations

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
)


def _token_id(s: str) -> int:
    if not s.startswith("token_id:"):
        raise AdapterError(f"vLLM returned token {s!r}, not 'token_id:N': send "
                           f"return_tokens_as_token_ids (vLLM >= 0.5)")
    return int(s[len("token_id:"):])


@SERVERS.register("vllm")
class VLLMServer:
    """vLLM's OpenAI server (dev mode, --logprobs-mode processed_logprobs): weights reloaded from its own model directory."""

    streams, versions, waves, takes_bytes, in_place = False, False, False, False, True

    def generate(self, ask: Ask) -> Call:
        r, s = ask.rollout, ask.rollout.sampling
        body = {"model": ask.model, "prompt": list(r.tokens),
                "max_tokens": ask.end - len(r.tokens), "temperature": s.temperature,
                "top_p": s.top_p, "top_k": s.top_k if s.top_k > 0 else -1, "seed": s.seed,
                "stop_token_ids": list(s.stop_token_ids), "ignore_eos": True,
                "stop": list(s.stop_strings) or None, "logprobs": 0,
                "return_tokens_as_token_ids": True, "skip_special_tokens": True}
        return Call("POST", "/v1/completions", json=body,
                    headers={"X-Request-Id": ask.request_id})

    def parse(self, data: Any) -> Piece:
        c = data["choices"][0]
        lp = c.get("logprobs") or {}
        ids = [_token_id(t) for t in lp.get("tokens") or []]
        if not ids and c.get("token_ids"):
            ids = list(c["token_ids"])
        lps = [float(x) for x in lp.get("token_logprobs") or []]
        if len(lps) != len(ids):
            raise AdapterError(f"vLLM returned {len(ids)} tokens with {len(lps)} log-probs")
        return Piece(ids, lps, None, c["finish_reason"])

    def abort(self, request_ids: list[str]) -> list[Call]:
        return []  # closing the connection aborts a request in vLLM

    def probe(self) -> Call:
        return Call("GET", "/is_paused")

    def inspect(self, reply: Reply) -> dict[str, Any]:
        if reply.status == 404:
            return {"updatable": "its weight routes are missing (GET /is_paused: 404): start "
                                 "vLLM with VLLM_SERVER_DEV_MODE=1"}
        check(reply, "GET /is_paused")
        return {"updatable": None}

    async def push(self, http: Http, weights: Weights, interrupt: bool) -> None:
        if weights.path is None:
            raise AdapterError("vLLM takes new weights from disk: set engine.weights_dir to "
                               "the model directory the server was started from")
        # always mode=abort: a response must never span two versions (see the docstring)
        check(await http.send(Call("POST", "/pause", params={"mode": "abort"})), "POST /pause")
        try:
            got = check(await http.send(Call("POST", "/collective_rpc",
                                             json={"method": "reload_weights"})),
                        "POST /collective_rpc reload_weights")
            if isinstance(got, dict) and any(isinstance(x, dict) and x.get("error")
                                             for x in got.get("results") or []):
                raise AdapterError(f"reload_weights failed on a worker: {got['results']}")
            check(await http.send(Call("POST", "/reset_prefix_cache")),
                  "POST /reset_prefix_cache")
        finally:
            check(await http.send(Call("POST", "/resume")), "POST /resume")
