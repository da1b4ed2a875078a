"""`reroll serve` over HTTP, in its own process: a seeded completion equals the in-process
engine's bitwise (tokens, behaviour log-probs, versions), streamed chunks add up to the
whole response, text prompts and chat are rendered like the trainer renders them, abort by
request id keeps the prefix, weight updates (safetensors bytes or a path) change what is
sampled and the version every token carries, and bad requests get a 4xx with a reason while
the server goes on serving."""

import asyncio
import json

import pytest
import torch

httpx = pytest.importorskip("httpx")

from serve_helpers import AUTH  # noqa: E402


@pytest.fixture(scope="module")
def served(tiny_servers, tiny_dir):
    """Server S, holding the tiny model's own weights as version 0 again."""
    from safetensors.torch import save

    from reroll.models import load

    s = tiny_servers[0]
    state = {k: v.detach().clone() for k, v in load(tiny_dir)[0].state_dict().items()}
    r = httpx.post(s.url + "/v1/weights?version=0", content=save(state), headers=AUTH)
    assert r.status_code == 200, r.text
    return s


def post(served, path, body, **kw):
    return httpx.post(served.url + path, json=body, headers=kw.pop("headers", AUTH),
                      timeout=60, **kw)


def in_process(tiny_dir, ids, seed, n_new, state=None, version=0):
    """What the engine in this process samples for one request."""
    from reroll.engine import TorchEngine
    from reroll.models import load
    from reroll.rollout import Rollout, SamplingParams

    model, tok = load(tiny_dir)
    if state is not None:
        model.load_state_dict(state, strict=False)  # lm_head is tied to the embedding
    eng = TorchEngine(model, tok, max_batch=16, version=version)
    r = Rollout("p", "g", list(ids), len(ids),
                sampling=SamplingParams(max_new_tokens=n_new, seed=seed, stop_token_ids=[]))
    eng.generate([r])
    return r.response_tokens, r.logprobs[len(ids):], r.versions[len(ids):]


BODY = {"prompt": [2, 5, 6, 7], "max_tokens": 10, "seed": 11, "ignore_eos": True,
        "logprobs": 0}


def test_seeded_completion_equals_the_in_process_engine_bitwise(served, tiny_dir):
    got = post(served, "/v1/completions", BODY)
    assert got.status_code == 200, got.text
    choice = got.json()["choices"][0]
    toks, lps, vers = in_process(tiny_dir, BODY["prompt"], 11, 10)
    assert choice["token_ids"] == toks and len(toks) == 10
    assert choice["logprobs"]["token_logprobs"] == lps  # JSON floats round-trip exactly
    assert choice["versions"] == vers == [0] * 10
    assert choice["finish_reason"] == "length" and got.json()["policy_version"] == 0


def test_streamed_chunks_add_up_to_the_whole_response(served):
    whole = post(served, "/v1/completions", BODY).json()["choices"][0]
    with httpx.stream("POST", served.url + "/v1/completions", json={**BODY, "stream": True},
                      headers=AUTH, timeout=60) as resp:
        lines = [x for x in resp.iter_lines() if x.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(x[6:])["choices"][0] for x in lines[:-1]]
    assert sum((c["token_ids"] for c in chunks), []) == whole["token_ids"]
    assert sum((c["logprobs"]["token_logprobs"] for c in chunks), []) == \
        whole["logprobs"]["token_logprobs"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    assert [c["finish_reason"] for c in chunks][-1] == "length"


def test_text_prompt_is_encoded_as_the_trainer_encodes_it_and_chat_uses_the_template(
        served, tiny):
    from reroll.build_rollout import encode_prompt

    _, tok = tiny
    text = post(served, "/v1/completions", {**BODY, "prompt": "3+4="}).json()
    ids = post(served, "/v1/completions", {**BODY, "prompt": encode_prompt(tok)("3+4=")}).json()
    assert text["choices"][0]["token_ids"] == ids["choices"][0]["token_ids"]
    assert text["usage"]["prompt_tokens"] == len(encode_prompt(tok)("3+4="))
    msgs = [{"role": "user", "content": "3+4="}]
    chat = post(served, "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "seed": 1,
                                                 "logprobs": True}).json()
    rendered = encode_prompt(tok, chat=True)("3+4=")
    assert chat["usage"]["prompt_tokens"] == len(rendered)
    c = chat["choices"][0]
    assert c["message"]["role"] == "assistant" and len(c["logprobs"]["content"]) == \
        len(c["token_ids"])


def test_bad_requests_get_a_4xx_with_a_reason_and_the_server_keeps_serving(served):
    url = served.url + "/v1/completions"
    cases = [  # (request kwargs, status, words the reason must contain)
        (dict(content=b'{"prompt": [1, 2', headers=AUTH), 400, "not valid JSON"),
        (dict(content=b'[1, 2]', headers=AUTH), 400, "JSON object"),
        (dict(json={**BODY, "model": "gpt-9"}, headers=AUTH), 404, "gpt-9"),
        (dict(json={**BODY, "max_tokens": 10**6}, headers=AUTH), 400, "context"),
        (dict(json={**BODY, "prompt": [2, 10**6]}, headers=AUTH), 400, "vocabulary"),
        (dict(json={**BODY, "temperature": "hot"}, headers=AUTH), 400, "temperature"),
        (dict(json={**BODY, "tempreture": 1.0}, headers=AUTH), 400, "tempreture: unknown"),
        (dict(json={**BODY, "frequency_penalty": 0.5}, headers=AUTH), 400, "not supported"),
        (dict(json=BODY, headers={"Authorization": "Bearer wrong"}), 401, "bearer"),
        (dict(json=BODY, headers={}), 401, "bearer"),
        (dict(json={**BODY, "prompt": [3] * 30000}, headers=AUTH), 413, "limit"),
    ]
    for kw, status, words in cases:
        got = httpx.post(url, timeout=60, **kw)
        assert got.status_code == status, (kw.get("json", kw.get("content")), got.text)
        assert words in got.json()["error"]["message"], got.text
    assert httpx.get(served.url + "/health").json()["status"] == "ok"  # no token needed
    assert post(served, "/v1/completions", BODY).status_code == 200
    m = httpx.get(served.url + "/metrics?format=json", headers=AUTH).json()
    assert m["http"]["errors_401"] >= 2 and m["http"]["errors_413"] >= 1
    assert m["engine"]["tokens_generated"] > 0


def test_abort_by_request_id_ends_the_stream_with_the_prefix(served):
    async def go():
        async with httpx.AsyncClient(base_url=served.url, headers=AUTH, timeout=60) as c:
            body = {**BODY, "max_tokens": 240, "stream": True, "request_id": "r-abort"}
            got = []
            async with c.stream("POST", "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    got.append(json.loads(line[6:])["choices"][0])
                    if len(got) == 1:
                        r = await c.post("/v1/abort", json={"request_ids": ["r-abort"]})
                        assert r.json()["aborted"] == ["r-abort"]
            return got

    chunks = asyncio.run(go())
    assert chunks[-1]["finish_reason"] == "abort"
    n = sum(len(c["token_ids"]) for c in chunks)
    assert 0 < n < 240


def test_weight_updates_as_bytes_or_a_path_change_samples_and_versions(served, tiny_dir,
                                                                        tmp_path):
    from safetensors.torch import load_file, save, save_file

    base = load_file(str(tiny_dir / "model.safetensors"))
    torch.manual_seed(0)
    moved = {k: v + 0.05 * torch.randn_like(v) for k, v in base.items()}
    r = httpx.post(served.url + "/v1/weights?version=3", content=save(moved),
                   headers={**AUTH, "content-type": "application/octet-stream"}, timeout=60)
    assert r.status_code == 200 and r.json() == {"version": 3, "tensors": len(moved)}
    got = post(served, "/v1/completions", BODY).json()
    toks, lps, _ = in_process(tiny_dir, BODY["prompt"], 11, 10, state=moved)
    assert got["policy_version"] == 3 and got["choices"][0]["versions"] == [3] * 10
    assert got["choices"][0]["token_ids"] == toks
    assert got["choices"][0]["logprobs"]["token_logprobs"] == lps
    save_file(base, str(tmp_path / "model.safetensors"))
    r = post(served, "/v1/weights", {"path": str(tmp_path), "version": 4})
    assert r.status_code == 200, r.text
    back = post(served, "/v1/completions", BODY).json()["choices"][0]
    assert back["token_ids"] == in_process(tiny_dir, BODY["prompt"], 11, 10)[0]
    bad = {k: v for k, v in list(base.items())[1:]}  # one tensor missing
    r = httpx.post(served.url + "/v1/weights?version=5", content=save(bad), headers=AUTH)
    assert r.status_code == 400 and "missing" in r.json()["error"]["message"]
    r = httpx.post(served.url + "/v1/weights?version=5", content=b"junk", headers=AUTH)
    assert r.status_code == 400 and "safetensors" in r.json()["error"]["message"]
    assert httpx.get(served.url + "/health").json()["version"] == 4
