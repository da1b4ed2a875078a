"""`reroll serve` on a LoRA run (its checkpoints hold the adapter alone) serves the base model
with the adapter merged: its greedy tokens and log-probs equal, bit for bit, the in-process
engine's on the plain model `reroll export` merges from the same checkpoint, and differ from
the base model's."""

import pytest

pytest.importorskip("peft", reason="[lora] trains adapters through peft (reroll[lora])")
httpx = pytest.importorskip("httpx")

PROMPT = [2, 5, 6, 7]


def greedy(model_dir, n_new):
    """Greedy tokens and log-probs of the engine in this process on ``model_dir``."""
    from reroll.engine import TorchEngine
    from reroll.models import load
    from reroll.rollout import Rollout, SamplingParams

    model, tok = load(model_dir)
    eng = TorchEngine(model.eval(), tok, max_batch=4)
    r = Rollout("p", "g", list(PROMPT), len(PROMPT),
                sampling=SamplingParams(temperature=0.0, max_new_tokens=n_new, stop_token_ids=[]))
    eng.generate([r])
    return r.response_tokens, r.logprobs[len(PROMPT):]


def test_serve_lora_checkpoint_serves_the_merged_weights(spawn, small_run, tmp_path):
    from reroll.cli import main
    from reroll.runtime import train

    run = tmp_path / "run"
    train(small_run(run, "lora.rank=4", "lora.alpha=8", "train.steps=2"), progress=False)
    assert (run / "checkpoints" / "step_000002" / "model" / "adapter_config.json").is_file()
    assert main(["export", str(run), str(tmp_path / "merged")]) == 0
    served = spawn(run)  # the run directory: its latest checkpoint
    got = httpx.post(served.url + "/v1/completions", timeout=60, json={
        "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "logprobs": 0})
    assert got.status_code == 200, got.text
    choice = got.json()["choices"][0]
    tokens, logprobs = greedy(tmp_path / "merged", 8)
    assert choice["token_ids"] == tokens and len(tokens) == 8
    assert choice["logprobs"]["token_logprobs"] == logprobs  # JSON floats round-trip exactly
    assert greedy(run / "init", 8)[1] != logprobs  # the adapter is in what is served
