"""OpenAIEngine against `reroll serve` in other processes: a `reroll train` run through it
equals the in-process run bitwise at max_staleness 0 (recorded tokens, behaviour log-probs,
versions and the final weights), an async run (max_staleness 1, partial rollouts) completes
within its staleness bound, abort keeps the prefix and generating again resumes it, and a
server killed mid-stream has its requests resumed on the other from the tokens already
received (nothing lost, the seeded tokens unchanged), also in the middle of a training run."""

import asyncio
import threading
import time

import pytest
import torch

httpx = pytest.importorskip("httpx")

from float_bounds import reorder_atol  # noqa: E402
from serve_helpers import TOKEN  # noqa: E402

from reroll.rollout import Example, SamplingParams, new_group  # noqa: E402

KEY = f"engine.api_key={TOKEN}"


@pytest.fixture(scope="module")
def servers(tiny_servers):
    return tiny_servers


def base_weights(tiny_dir):
    from reroll.models import load

    return {k: v.detach().clone() for k, v in load(tiny_dir)[0].state_dict().items()}


def groups(n_groups, size, n_new):
    sp = SamplingParams(temperature=1.0, max_new_tokens=n_new, stop_token_ids=[])
    gs = [new_group(Example(f"p{i}", "", ""), size, [2, 5 + i, 6, 7], sp, 0)
          for i in range(n_groups)]
    rs = [r for g in gs for r in g.rollouts]
    for i, r in enumerate(rs):
        r.sampling.seed = 1000 + i
    return rs


def reference(tiny_dir, rollouts):
    """The in-process engine's tokens and log-probs for copies of ``rollouts``."""
    import copy

    from reroll.engine import TorchEngine
    from reroll.models import load

    model, tok = load(tiny_dir)
    rs = copy.deepcopy(rollouts)
    TorchEngine(model, tok, max_batch=16).generate(rs)
    return rs


def test_train_through_reroll_serve_equals_the_in_process_run_bitwise(small_run, servers,
                                                                      tiny_dir, tmp_path):
    from safetensors.torch import load_file

    from reroll.runlog import read_metrics, read_rollouts
    from reroll.runtime import train

    a, b = tmp_path / "a", tmp_path / "b"
    train(small_run(a, f"init={tiny_dir}", "train.steps=3"), progress=False)
    train(small_run(b, f"init={tiny_dir}", "train.steps=3", "engine.name=openai",
                    f"engine.base_url={servers[0].url}", KEY), progress=False)
    ra, rb = read_rollouts(a), read_rollouts(b)
    assert len(ra) == len(rb) == 12  # 3 steps x 4 groups
    for (sa, ga), (sb, gb) in zip(ra, rb):
        assert sa == sb
        for x, y in zip(ga["rollouts"], gb["rollouts"], strict=True):
            for key in ("tokens", "logprobs", "versions", "loss_mask", "finish", "reward"):
                assert x[key] == y[key], key
    last = "checkpoints/step_000003/model/model.safetensors"
    wa, wb = load_file(str(a / last)), load_file(str(b / last))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert all(r["grad_norm"] > 0 for r in read_metrics(b) if "grad_norm" in r)


def test_async_training_through_reroll_serve_completes_within_its_staleness(
        small_run, servers, tiny_dir, tmp_path):
    from reroll.runlog import read_metrics, read_rollouts
    from reroll.runtime import train

    train(small_run(tmp_path, f"init={tiny_dir}", "train.steps=4", "runtime.max_staleness=1",
                    "runtime.partial_rollouts=true", "engine.name=openai",
                    f"engine.base_url={servers[0].url}", KEY), progress=False)
    rows = [r for r in read_metrics(tmp_path) if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for step, g in read_rollouts(tmp_path):  # trained by version step - 1, lag <= 1
        for r in g["rollouts"]:
            assert min(v for v, m in zip(r["versions"], r["loss_mask"]) if m) >= step - 2


def test_abort_keeps_the_prefix_and_generating_again_resumes_it(servers, tiny_dir, tiny):
    from reroll.engine import Engine
    from reroll.engine.openai import OpenAIEngine

    r = groups(1, 1, 200)[0]
    ref = reference(tiny_dir, [r])[0]
    eng = OpenAIEngine(servers[0].url, tokenizer=tiny[1], api_key=TOKEN)
    assert isinstance(eng, Engine)  # the protocol the workflows and the scheduler call
    eng.connect(base_weights(tiny_dir))

    async def go():
        fut = eng.generate(r)
        while r.response_len == 0:
            await asyncio.sleep(0.002)
        got = await eng.abort([r.sample_id])
        assert got == [r] and (await fut) is r and r.finish == "abort"
        n = r.response_len
        await eng.generate(r)
        await eng.close()
        return n

    n = asyncio.run(go())
    assert 0 < n < 200 and r.finish == "length" and r.response_len == 200
    assert r.resume_count == 1  # the prefix was prefilled again once
    assert r.response_tokens == ref.response_tokens  # seeded: the same tokens either way
    assert r.logprobs[:4 + n] == ref.logprobs[:4 + n]  # before the abort: the same floats
    assert eng.stats()["requests_aborted"] == 1


def test_a_server_killed_mid_stream_has_its_requests_resumed_on_the_other(servers, tiny_dir,
                                                                           tiny):
    from reroll.engine.openai import OpenAIEngine

    s, t1 = servers[0], servers[1]
    rollouts = groups(4, 4, 200)
    ref = reference(tiny_dir, rollouts)
    eng = OpenAIEngine([s.url, t1.url], tokenizer=tiny[1], api_key=TOKEN)
    eng.connect(base_weights(tiny_dir))

    async def go():
        futs = [eng.generate(r) for r in rollouts]
        await asyncio.sleep(0)
        on_t1 = [j for j in eng._jobs.values() if j.server is eng.servers[1]]
        assert len(on_t1) == 8  # two of the four groups: spread by load
        while not any(j.rollout.response_len for j in on_t1):
            await asyncio.sleep(0.002)
        t1.kill()
        await asyncio.gather(*futs)
        await eng.close()
        return [j.rollout for j in on_t1]

    moved = asyncio.run(go())
    assert all(r.finish == "length" and r.response_len == 200 for r in rollouts)  # none lost
    st = eng.stats()
    assert st["server_failures"] == 1 and st["failovers"] == 8 and st["servers_alive"] == 1
    assert any(0 < r.resume_count for r in moved)  # resumed from the tokens received
    # a resumed request re-prefills what it had received (one prefill forward) where the
    # reference decoded those tokens one step at a time: other kernel shapes, so log-probs
    # agree within float_bounds' reordering bound (tests/engine/engine_helpers.forward_atol:
    # the model's longest reduction, 5 chained reductions a layer plus the output embedding
    # and the normaliser). Tokens are seeded draws from the same uniforms, equal unless a
    # uniform falls within that rounding of a CDF boundary.
    c = tiny[0].config
    n, depth = max(c.hidden_size, c.intermediate_size, c.vocab_size), 5 * c.num_hidden_layers + 2
    for r, q in zip(rollouts, ref):
        assert r.response_tokens == q.response_tokens
        want = torch.tensor(q.logprobs)
        torch.testing.assert_close(torch.tensor(r.logprobs), want, rtol=0.0,
                                   atol=reorder_atol(n, want, depth))


def test_a_training_run_survives_a_server_killed_while_it_generates(small_run, servers,
                                                                     tiny_dir, tmp_path):
    from reroll.runlog import read_metrics
    from reroll.runtime import train

    s, t2 = servers[0], servers[2]
    killed = threading.Event()

    def killer():  # kill T2 the moment it has taken requests (mid-stream, or between steps)
        while not killed.is_set():
            try:
                m = httpx.get(t2.url + "/metrics?format=json", timeout=5,
                              headers={"Authorization": f"Bearer {TOKEN}"}).json()
            except httpx.TransportError:
                return
            if m["engine"]["serve_requests"] > 0:
                t2.kill()
                killed.set()
            time.sleep(0.001)

    watch = threading.Thread(target=killer, daemon=True)
    watch.start()
    urls = f'engine.base_url=["{s.url}", "{t2.url}"]'
    train(small_run(tmp_path, f"init={tiny_dir}", "train.steps=4", "rollout.max_new_tokens=12",
                    "engine.name=openai", urls, KEY), progress=False)
    watch.join(timeout=5)
    assert killed.is_set() and t2.proc.poll() is not None
    rows = [r for r in read_metrics(tmp_path) if "reward/mean" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[-1]["pipeline/consumed"] == 16
