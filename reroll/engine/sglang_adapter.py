"""`engine.server = "sglang"`: SGLang's native server API, the only module of reroll that
knows its conventions. Written against SGLang's documented request/response shapes and
tested against a stand-in that answers with them; it is not run against a real SGLang here
(that needs a GPU).

- Generation: ``POST /generate`` with ``input_ids`` (the whole sequence), ``rid`` (reroll's
  request id), ``sampling_params`` (``max_new_tokens``, ``temperature``, ``top_p``,
  ``top_k`` -1 when off, ``stop_token_ids``, ``stop``, ``sampling_seed``) and
  ``return_logprob`` with ``logprob_start_len: -1`` (output tokens only). The reply's
  ``meta_info.output_token_logprobs`` is a list of ``[logprob, token_id, text]``,
  ``meta_info.finish_reason.type`` is ``stop``, ``length`` or ``abort``.
- Behaviour log-probs: check that your SGLang version reports the log-probs of the
  distribution it sampled from (after temperature); the trainer's importance weights divide
  by them.
- Versions: every token is stamped with the version reroll last pushed before sending the
  request; a push aborts in-flight requests first (``abort_all_requests``), so a reply never
  spans two versions. (``meta_info.weight_version`` is not used: a reply that the push
  aborted may already read the version that replaced its weights.)
- Weights: ``POST /update_weights_from_disk`` with ``model_path`` (a directory reroll
  writes under ``engine.weights_dir``: the server must be able to read it),
  ``weight_version`` and ``abort_all_requests``; the reply says ``success`` and
  ``message``. The probe is ``GET /get_model_info``.
- Abort: ``POST /abort_request`` with ``rid``; the request returns what it sampled with
  finish ``abort``.
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


@SERVERS.register("sglang")
class SGLangServer:
    """SGLang's native /generate: weights from disk via /update_weights_from_disk."""

    streams, versions, waves, takes_bytes, in_place = False, False, False, False, False

    def generate(self, ask: Ask) -> Call:
        r, s = ask.rollout, ask.rollout.sampling
        sp: dict[str, Any] = {"max_new_tokens": ask.end - len(r.tokens),
                              "temperature": s.temperature, "top_p": s.top_p,
                              "top_k": s.top_k if s.top_k > 0 else -1,
                              "stop_token_ids": list(s.stop_token_ids),
                              "skip_special_tokens": True}
        if s.stop_strings:
            sp["stop"] = list(s.stop_strings)
        if s.seed is not None:
            sp["sampling_seed"] = s.seed
        return Call("POST", "/generate", json={
            "input_ids": list(r.tokens), "sampling_params": sp, "rid": ask.request_id,
            "return_logprob": True, "logprob_start_len": -1, "stream": False})

    def parse(self, data: Any) -> Piece:
        meta = data.get("meta_info") if isinstance(data, dict) else None
        if not isinstance(meta, dict):
            raise AdapterError(f"SGLang reply without meta_info: {str(data)[:200]}")
        rows = meta.get("output_token_logprobs") or []
        ids = [int(row[1]) for row in rows]
        lps = [float(row[0]) for row in rows]
        finish = (meta.get("finish_reason") or {}).get("type")
        return Piece(ids, lps, None, finish or "stop")

    def abort(self, request_ids: list[str]) -> list[Call]:
        return [Call("POST", "/abort_request", json={"rid": rid}) for rid in request_ids]

    def probe(self) -> Call:
        return Call("GET", "/get_model_info")

    def inspect(self, reply: Reply) -> dict[str, Any]:
        d = check(reply, "GET /get_model_info")
        return {"updatable": None, "model": d.get("model_path")}

    async def push(self, http: Http, weights: Weights, interrupt: bool) -> None:
        if weights.path is None:
            raise AdapterError("SGLang takes new weights from disk: set engine.weights_dir "
                               "to a directory the server can read")
        # always abort: a reply must never span two versions (see the docstring)
        got = check(await http.send(Call("POST", "/update_weights_from_disk", json={
            "model_path": weights.path, "weight_version": str(weights.version),
            "abort_all_requests": True})), "POST /update_weights_from_disk")
        if not (isinstance(got, dict) and got.get("success")):
            raise AdapterError(f"SGLang refused the weights of version {weights.version}: "
                               f"{got.get('message') if isinstance(got, dict) else got}")
