"""The vLLM and SGLang adapters against stand-ins that answer with the request and response
shapes those projects document (`standins.py`; the real servers need a GPU): token ids and
behaviour log-probs read from each server's own fields, a weight push through each server's
own routes landing in the middle of a request (the request is stopped, keeps what it
sampled under the old version and is resumed under the new one), abort, and the refusal of
a server whose weights cannot be updated, naming why."""

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
import torch

httpx = pytest.importorskip("httpx")

from serve_helpers import Served, ready  # noqa: E402

from reroll.rollout import Rollout, SamplingParams  # noqa: E402

STANDINS = Path(__file__).with_name("standins.py")


@pytest.fixture()
def standin():
    started = []

    def go(kind: str, model_dir: Path, *args: str) -> Served:
        proc = subprocess.Popen([sys.executable, str(STANDINS), kind, str(model_dir), *args],
                                stdout=subprocess.PIPE, text=True)
        started.append(Served("", proc))
        started[-1] = ready(proc, probe="/calls")
        return started[-1]

    yield go
    for s in started:
        s.stop()


def weights(value: float) -> dict:
    return {"w": torch.tensor([value])}


def model_dir(path: Path, value: float) -> Path:
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    save_file(weights(value), str(path / "model.safetensors"))
    return path


def rollout(n_new: int, seed: int = 7) -> Rollout:
    return Rollout("p", "g", [1, 2, 3], 3, sampling=SamplingParams(
        max_new_tokens=n_new, seed=seed, stop_token_ids=[0]))


def expected(r: Rollout, w_of_version: dict[int, float]) -> tuple[list, list]:
    """The fake model's tokens and log-probs at each position of ``r``'s response."""
    pos = range(3, len(r.tokens))
    return ([(7 + p) % 50 + 3 for p in pos],
            [-w_of_version[v] - p / 1000 for p, v in zip(pos, r.versions[3:])])


async def sampling(s: Served, n: int) -> None:
    """Wait until the server has sampled ``n`` more tokens."""
    async with httpx.AsyncClient() as c:
        start = (await c.get(s.url + "/produced")).json()
        while (await c.get(s.url + "/produced")).json() < start + n:
            await asyncio.sleep(0.005)


def push_mid_request(s: Served, eng, r: Rollout, new: dict, version: int):
    """Start ``r``; once the server runs it, push ``new`` as ``version``; wait for ``r``."""
    async def go():
        fut = eng.generate(r)
        await sampling(s, 5)
        await eng.update_weights(new, version)
        await fut
        await eng.close()

    asyncio.run(go())


def pushed_mid_request(s: Served, eng, w_new: float) -> Rollout:
    """Connect with w = 1 (version 0), sample 40 tokens and push w = ``w_new`` (version 1)
    in the middle: the tokens before the push are version 0's, the rest version 1's."""
    eng.connect(weights(1.0), need_updates=True)
    r = rollout(40)
    push_mid_request(s, eng, r, weights(w_new), 1)
    assert r.finish == "length" and r.response_len == 40
    toks, lps = expected(r, {0: 1.0, 1: w_new})
    assert r.response_tokens == toks and r.logprobs[3:] == pytest.approx(lps)
    n0 = r.versions[3:].count(0)
    assert 0 < n0 < 40 and r.versions[3:] == [0] * n0 + [1] * (40 - n0)
    return r


def test_vllm_adapter_reads_token_ids_and_pushes_through_the_dev_routes(standin, tmp_path):
    from reroll.engine.openai import OpenAIEngine

    d = model_dir(tmp_path / "m", 1.0)
    s = standin("vllm", d, "--delay-ms", "5")
    r = pushed_mid_request(s, OpenAIEngine(s.url, server="vllm", weights_dir=str(d)), 2.0)
    assert r.resume_count == 1  # the prefix went back to the server once
    push = ["/pause?mode=abort", "/collective_rpc reload_weights", "/reset_prefix_cache",
            "/resume"]
    assert httpx.get(s.url + "/calls").json() == push + ["/v1/completions"] + push + [
        "/v1/completions"]


def test_vllm_without_dev_mode_or_weights_dir_is_refused_naming_why(standin, tmp_path):
    from reroll.config import ConfigError
    from reroll.engine.openai import OpenAIEngine

    d = model_dir(tmp_path / "m", 1.0)
    s = standin("vllm", d, "--no-dev")
    with pytest.raises(ConfigError, match="cannot take new weights.*VLLM_SERVER_DEV_MODE=1"):
        OpenAIEngine(s.url, server="vllm", weights_dir=str(d)).connect(need_updates=True)
    t = standin("vllm", d)
    with pytest.raises(ConfigError, match="engine.weights_dir"):
        OpenAIEngine(t.url, server="vllm").connect(need_updates=True)
    OpenAIEngine(s.url, server="vllm").connect()  # generating only: fine


def test_sglang_adapter_reads_meta_info_pushes_from_disk_and_aborts(standin, tmp_path):
    from reroll.engine.openai import OpenAIEngine

    s = standin("sglang", model_dir(tmp_path / "init", 1.0), "--delay-ms", "5")
    pushed_mid_request(s, OpenAIEngine(s.url, server="sglang",
                                       weights_dir=str(tmp_path / "pushes")), 3.0)
    assert sorted(p.name for p in (tmp_path / "pushes").iterdir()) == ["v000000", "v000001"]

    async def abort():
        eng2 = OpenAIEngine(s.url, server="sglang", weights_dir=str(tmp_path / "pushes"))
        q = rollout(400, seed=9)
        fut = eng2.generate(q)
        await sampling(s, 5)
        assert await eng2.abort([q.sample_id]) == [q]
        assert (await fut).finish == "abort"
        await eng2.close()
        return q

    q = asyncio.run(abort())
    assert 0 < q.response_len < 400 and "/abort_request" in httpx.get(s.url + "/calls").json()


def test_a_training_run_refuses_to_start_against_a_server_it_cannot_update(standin, small_run,
                                                                          tiny_dir, tmp_path):
    from reroll.config import ConfigError
    from reroll.runtime import train

    s = standin("vllm", model_dir(tmp_path / "m", 1.0), "--no-dev")
    cfg = small_run(tmp_path / "run", f"init={tiny_dir}", "engine.name=openai",
                    f"engine.base_url={s.url}", "engine.server=vllm",
                    f"engine.weights_dir={tmp_path / 'm'}", "runtime.max_staleness=1")
    with pytest.raises(ConfigError, match=r"cannot take new weights.*refuses to start"):
        train(cfg, progress=False)
    assert httpx.get(s.url + "/calls").json() == []  # nothing was generated


def test_reroll_serve_started_without_weight_updates_refuses_them_and_says_so(tiny):
    from reroll.engine import TorchEngine
    from reroll.engine.adapters import Reply
    from reroll.engine.reroll_adapter import RerollServer
    from reroll.serve.backend import ServeBackend
    from reroll.serve.schemas import BadRequest

    model, tok = tiny
    b = ServeBackend(TorchEngine(model, tok, max_batch=4), tok, model_name="t", updatable=False)

    async def go():
        with pytest.raises(BadRequest, match="--no-weight-updates") as e:
            await b.update_weights(model.state_dict(), 1, True)
        await b.close()
        return e.value.status

    assert asyncio.run(go()) == 403
    health = {"status": "ok", "model": "t", "version": 0, "weight_updates": False}
    assert "--no-weight-updates" in RerollServer().inspect(Reply(200, health))["updatable"]


def test_a_server_back_from_the_dead_gets_the_latest_weights_before_it_serves(standin,
                                                                            tmp_path):
    from reroll.engine.openai import OpenAIEngine

    d = model_dir(tmp_path / "init", 1.0)
    a, b = standin("sglang", d), standin("sglang", d)
    eng = OpenAIEngine([a.url, b.url], server="sglang", weights_dir=str(tmp_path / "w"),
                       revive_s=0.1)
    eng.connect(weights(1.0), need_updates=True)
    b.kill()
    two = [rollout(4), rollout(4, seed=8)]
    two[1].group_id = "h"  # two groups: one per server once both are up

    async def go():
        await eng.update_weights(weights(2.0), 1)  # B does not answer: down; A takes it
        b2 = standin("sglang", d, "--port", b.url.rsplit(":", 1)[1])  # B, version 0 again
        await asyncio.sleep(0.2)  # past revive_s
        eng.fleet.revive_later()
        while not eng.servers[1].alive:
            await asyncio.sleep(0.01)
        await asyncio.gather(*(eng.generate(r) for r in two))
        await eng.close()
        return b2

    b2 = asyncio.run(go())
    assert eng.stats()["server_failures"] == 1 and eng.servers[1].version == 1
    # B took version 1's weights (pushed on revival) before it served anything
    assert httpx.get(b2.url + "/calls").json() == ["/update_weights_from_disk", "/generate"]
    for r in two:  # both served under w = 2 (version 1)
        assert r.versions[3:] == [1] * 4 and r.logprobs[3:] == pytest.approx(expected(
            r, {1: 2.0})[1])
