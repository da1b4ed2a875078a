"""`reroll serve` refuses what would make it serve garbage or queue unbounded work: weights
that are not finite or were cast to an integer type, a model served with NaN weights (`/health`
says so), numbers sent as strings, Infinity, NaN or negative values, and more sequences than
a request or a client may queue. Always a 4xx (or 503) with a reason, never a 500. In
process: the app over a real TorchEngine, through httpx's ASGI transport."""

import asyncio

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")

BODY = {"prompt": [2, 5, 6, 7], "max_tokens": 4, "seed": 1, "ignore_eos": True}


def serve(tiny, coro, **bounds):
    """Run ``coro(client, backend, model)`` against a fresh app over the tiny model."""
    from reroll.engine import TorchEngine
    from reroll.serve.app import create_app
    from reroll.serve.backend import ServeBackend

    model, tok = tiny

    async def go():
        b = ServeBackend(TorchEngine(model, tok, max_batch=8), tok, model_name="t",
                         wave_timeout_s=30.0)
        app = create_app(b, **bounds)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://t", timeout=60) as c:
            try:
                return await coro(c, b, model)
            finally:
                await b.close()

    return asyncio.run(go())


def tensors(model, fn):
    from safetensors.torch import save

    return save({k: fn(v.detach().clone()).contiguous() for k, v in model.state_dict().items()})


def test_non_finite_or_integer_weights_are_refused_and_the_server_keeps_its_own(tiny):
    import torch

    async def go(c, b, model):
        out = {}
        for name, fn in [("nan", lambda v: torch.full_like(v, float("nan"))),
                         ("int8", lambda v: v.to(torch.int8)),
                         ("inf", lambda v: v.index_fill(0, torch.tensor([0]), float("inf")))]:
            r = await c.post("/v1/weights?version=5", content=tensors(model, fn))
            out[name] = (r.status_code, r.json()["error"]["message"])
        health = (await c.get("/health")).json()
        ok = await c.post("/v1/completions", json=BODY)
        return out, health, ok.status_code

    out, health, ok = serve(tiny, go)
    assert out["nan"][0] == 400 and "non-finite values" in out["nan"][1], out
    assert out["inf"][0] == 400 and "non-finite values" in out["inf"][1], out
    assert out["int8"][0] == 400 and "torch.int8" in out["int8"][1], out
    assert health["status"] == "ok" and health["version"] == 0 and ok == 200


def test_health_reports_the_weights_served_and_generation_waits_for_good_ones(tiny):
    import torch

    model, tok = tiny
    good = tensors(model, lambda v: v)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))

    async def go(c, b, model):
        sick = await c.get("/health")
        refused = await c.post("/v1/completions", json=BODY)
        put = await c.post("/v1/weights?version=1", content=good)
        well = await c.get("/health")
        ok = await c.post("/v1/completions", json=BODY)
        return sick, refused, put.status_code, well.json(), ok.status_code

    sick, refused, put, well, ok = serve(tiny, go)
    assert sick.status_code == 503 and "non-finite" in sick.json()["reason"]
    assert refused.status_code == 503 and "/v1/weights" in refused.json()["error"]["message"]
    assert put == 200 and well["status"] == "ok" and well["version"] == 1 and ok == 200


@pytest.mark.parametrize(("body", "words"), [
    (b'{"prompt": [2, 5], "max_tokens": "16"}', "max_tokens"),
    (b'{"prompt": [2, 5], "temperature": Infinity}', "temperature: Input should be a finite"),
    (b'{"prompt": [2, 5], "temperature": NaN}', "temperature: Input should be a finite"),
    (b'{"prompt": [2, 5], "temperature": -1}', "temperature"),
    (b'{"prompt": [2, 5], "max_tokens": -3}', "max_tokens"),
    (b'{"prompt": [2, 5], "n": -1}', "n:"),
    (b'{"prompt": [2, 5], "n": true}', "n:"),
    (b'{"prompt": [2, 5], "top_p": -0.5}', "top_p"),
    (b'{"prompt": [2, 5], "seed": -7}', "seed"),
    (b'{"prompt": [2, -5]}', "prompt"),
])
def test_wrongly_typed_or_non_finite_parameters_get_a_400_with_the_field(tiny, body, words):
    async def go(c, b, model):
        r = await c.post("/v1/completions", content=body,
                         headers={"content-type": "application/json"})
        return r.status_code, r.json()["error"]["message"]

    status, message = serve(tiny, go)
    assert status == 400 and words in message, message


def test_the_work_one_request_or_one_client_may_queue_is_bounded(tiny):
    async def go(c, b, model):
        big = await c.post("/v1/completions", json={**BODY, "prompt": [[2, 5]] * 3, "n": 3})
        held = asyncio.ensure_future(c.post("/v1/completions", json={
            **BODY, "reroll": {"wave": "w", "wave_size": 2, "wave_index": 0}}))
        while not b.jobs:  # the first of the wave is held, counted against this client
            await asyncio.sleep(0.01)
        over = await c.post("/v1/completions", json={**BODY, "n": 2})
        rest = await c.post("/v1/completions", json={
            **BODY, "reroll": {"wave": "w", "wave_size": 2, "wave_index": 1}})
        first = await held
        again = await c.post("/v1/completions", json={**BODY, "n": 2})
        return big, over, rest.status_code, first.status_code, again.status_code

    big, over, rest, first, again = serve(tiny, go, max_request_sequences=8,
                                          max_client_sequences=2)
    assert big.status_code == 400 and "9 sequences exceed" in big.json()["error"]["message"]
    assert over.status_code == 429 and "--max-client-sequences" in over.json()["error"]["message"]
    assert rest == first == again == 200  # the bound frees as requests finish
