"""Engine greedy decoding equals transformers `generate(do_sample=False)` token for token."""

import torch
from engine_helpers import PROMPTS, make
from transformers import GenerationConfig

from reroll.engine import TorchEngine

N = 40


def reference(model, tok, text: str, n: int, eos: int | None = None) -> list[int]:
    ids = torch.tensor([tok.encode(text)], device=model.device)
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=0)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
    return out[0, ids.shape[1]:].tolist()


def test_greedy_equals_generate_for_a_batch_with_requests_joining_mid_flight(lm):
    model, tok = lm
    refs = [reference(model, tok, p, N) for p in PROMPTS]
    assert all(len(r) == N for r in refs)
    assert len({tuple(r[10:]) for r in refs}) == len(PROMPTS)  # varied, not one repeated char
    eng = TorchEngine(model, tok, max_batch=3)  # fewer slots than requests: queueing + reuse
    first = [make(tok, p, temperature=0.0, max_new_tokens=N) for p in PROMPTS[:2]]
    eng.add(first)
    for _ in range(7):  # the first two are 8 tokens in when the rest arrive
        eng.step()
    rest = [make(tok, p, temperature=0.0, max_new_tokens=N) for p in PROMPTS[2:]]
    eng.add(rest)
    while eng.pending():
        eng.step()
    for r, ref in zip(first + rest, refs, strict=True):
        assert r.finish == "length"
        assert r.response_tokens == ref, r.prompt_id


def test_greedy_stopping_at_eos_equals_generate_with_eos(lm):
    model, tok = lm
    eos = tok.eos_token_id
    rs = [make(tok, p, temperature=0.0, max_new_tokens=N, stop_token_ids=[eos]) for p in PROMPTS]
    TorchEngine(model, tok, max_batch=8).generate(rs)
    for r in rs:
        ref = reference(model, tok, r.prompt_id, N, eos=eos)
        if eos in ref:  # generate pads after eos in a batch; alone it stops at eos
            ref = ref[: ref.index(eos) + 1]
        assert r.response_tokens == ref
        assert r.finish == ("stop" if ref[-1] == eos else "length")
