"""The asynchronous Engine (EngineService over a TorchEngine core): the same tokens and
log-probs as the synchronous core, interrupt-and-resume across a weight update, snapshots of
in-flight records, one-turn calls, and errors reaching every waiting caller."""

import asyncio
import copy

import pytest
import torch
from engine_helpers import PROMPTS, full_logprobs, make, spread

from reroll.engine import EngineService, TorchEngine


def test_concurrent_generate_equals_the_synchronous_core_bitwise(lm):
    model, tok = lm
    sync = [make(tok, p, temperature=1.0, max_new_tokens=12, seed=i) for i, p in enumerate(PROMPTS)]
    TorchEngine(model, tok, max_batch=8).generate(sync)
    recs = [make(tok, p, temperature=1.0, max_new_tokens=12, seed=i) for i, p in enumerate(PROMPTS)]

    async def main():
        svc = EngineService(TorchEngine(model, tok, max_batch=8))
        got = await asyncio.gather(*(svc.generate(r) for r in recs))
        await svc.close()
        return got

    got = asyncio.run(main())
    assert [g is r for g, r in zip(got, recs)] == [True] * len(recs)  # the caller's records
    for a, b in zip(sync, recs):
        assert a.tokens == b.tokens and a.logprobs == b.logprobs and a.finish == b.finish


def test_interrupt_resumes_under_new_weights_with_versions_and_logprobs_to_match(lm,
                                                                                device):
    model, tok = lm
    old = {k: v.clone() for k, v in model.state_dict().items()}
    new_model = type(model)(model.config)
    spread(new_model, seed=11)
    new_model.to(device)
    r = make(tok, "hello world ", temperature=1.0, max_new_tokens=20, seed=5)

    async def main():
        svc = EngineService(TorchEngine(model, tok, max_batch=2), max_steps_per_call=1)
        fut = svc.generate(r)
        while svc.stats()["tokens_generated"] < 3:
            await asyncio.sleep(0.001)
        await svc.update_weights(new_model.state_dict(), 1, interrupt=True)
        await fut
        await svc.close()

    asyncio.run(main())
    P = r.prompt_len
    k = r.versions.count(0)  # tokens sampled before the interrupt
    assert 3 <= k < 20 and r.response_len == 20 and r.finish == "length"
    assert r.versions == [-1] * P + [0] * k + [1] * (20 - k)
    assert r.resume_count == 1
    new_lp = full_logprobs(new_model, r.tokens)[P + k - 1:]
    assert (torch.tensor(r.logprobs[P + k:]) - new_lp).abs().max() < 1e-4
    old_model = type(model)(model.config).to(device)
    old_model.load_state_dict(old)
    old_lp = full_logprobs(old_model, r.tokens)[P - 1:P + k - 1]
    assert (torch.tensor(r.logprobs[P:P + k]) - old_lp).abs().max() < 1e-4


def test_sync_brings_in_flight_records_up_to_date_without_interrupting(lm):
    model, tok = lm
    r = make(tok, "abc", temperature=1.0, max_new_tokens=30, seed=3)
    ref = make(tok, "abc", temperature=1.0, max_new_tokens=30, seed=3)
    TorchEngine(model, tok, max_batch=2).generate([ref])
    seen = {}

    async def main():
        svc = EngineService(TorchEngine(model, tok, max_batch=2), max_steps_per_call=1)
        fut = svc.generate(r)
        while svc.stats()["tokens_generated"] < 5:
            await asyncio.sleep(0.001)
        await svc.sync()
        n = len(r.tokens)
        seen["snap"] = (list(r.tokens), n == len(r.logprobs) == len(r.versions), r.finish)
        await fut
        await svc.close()

    asyncio.run(main())
    toks, aligned, finish = seen["snap"]
    assert len(toks) - r.prompt_len >= 5 and aligned and finish == "running"
    assert toks == ref.tokens[: len(toks)]  # a prefix of the uninterrupted output
    assert r.tokens == ref.tokens and r.logprobs == ref.logprobs and r.resume_count == 0


def test_a_turn_samples_at_most_its_budget_and_stop_strings_look_only_at_the_turn(lm):
    model, tok = copy.deepcopy(lm[0]), lm[1]
    spread(model, seed=4)
    r = make(tok, "12+34=", temperature=0.0, max_new_tokens=50)
    TorchEngine(model, tok, max_batch=2).generate([r])
    full = r.response_tokens
    # the same greedy text, sampled as two turns of 3 and 4 tokens
    t = make(tok, "12+34=", temperature=0.0, max_new_tokens=50)
    P = t.prompt_len

    async def main():
        svc = EngineService(TorchEngine(model, tok, max_batch=2))
        await svc.generate(t, turn=(P, P + 3))
        assert t.finish == "length" and t.response_tokens == full[:3]
        text3 = tok.decode(full[:3])
        t.sampling.stop_strings = [text3]  # present before this turn: must not stop it
        t.finish = "running"
        await svc.generate(t, turn=(P + 3, P + 7))
        await svc.close()

    asyncio.run(main())
    assert t.response_tokens == full[:7] and t.finish == "length"


def test_an_engine_failure_reaches_every_waiting_caller(lm):
    model, tok = lm

    class Broken(TorchEngine):
        def step(self):
            raise RuntimeError("CUDA error: device-side assert")

    async def main():
        svc = EngineService(Broken(model, tok, max_batch=2))
        futs = [svc.generate(make(tok, p, max_new_tokens=4, seed=1)) for p in PROMPTS[:2]]
        out = await asyncio.gather(*futs, return_exceptions=True)
        with pytest.raises(RuntimeError, match="engine failed earlier"):
            svc.generate(make(tok, "z", max_new_tokens=4))
        await svc.close()
        return out

    out = asyncio.run(main())
    assert all(isinstance(e, RuntimeError) and "device-side assert" in str(e) for e in out)


def test_abort_resolves_with_the_prefix_and_generating_again_resumes_it(lm):
    """`Engine.abort`: the awaitable resolves at once with finish "abort" and the tokens
    sampled so far (log-probs and versions aligned); a request still queued resolves with
    nothing sampled; generating the aborted record again continues it to its limit."""
    model, tok = lm
    r = make(tok, "hello world ", temperature=1.0, max_new_tokens=20, seed=5)
    q = make(tok, "abc ", temperature=1.0, max_new_tokens=20, seed=6)
    ref = make(tok, "hello world ", temperature=1.0, max_new_tokens=20, seed=5)
    TorchEngine(model, tok, max_batch=2).generate([ref])

    async def main():
        svc = EngineService(TorchEngine(model, tok, max_batch=2), max_steps_per_call=1)
        fut = svc.generate(r)
        while svc.stats()["tokens_generated"] < 3:
            await asyncio.sleep(0.001)
        fq = svc.generate(q)  # submitted in this pass: still queued when abort comes
        got = await svc.abort([r.sample_id, q.sample_id])
        assert fut.done() and fq.done() and (await fut) is r and (await fq) is q
        assert {x.sample_id for x in got} == {r.sample_id, q.sample_id}
        k = r.response_len
        assert r.finish == "abort" and 3 <= k < 20 and not r.finished
        assert q.finish == "abort" and q.response_len == 0
        assert r.tokens == ref.tokens[:len(r.tokens)] and r.logprobs == ref.logprobs[:len(r.tokens)]
        assert len(r.tokens) == len(r.logprobs) == len(r.versions) == len(r.loss_mask)
        await svc.generate(r)  # a resume under the same weights
        await svc.close()
        return k

    k = asyncio.run(main())
    assert r.finish == "length" and r.response_len == 20 and r.resume_count == 1
    assert r.tokens[:r.prompt_len + k] == ref.tokens[:r.prompt_len + k]
