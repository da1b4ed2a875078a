"""Other transformers causal LMs, built tiny from their configs: greedy equals `generate`
(sdpa and eager attention, the latter taking the engine's additive-float masks)."""

import pytest
import torch
import transformers as T
from engine_helpers import make, spread
from transformers import AutoModelForCausalLM, GenerationConfig

from reroll.engine import TorchEngine
from reroll.models import build_tokenizer

SMALL = dict(num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
             max_position_embeddings=256)
CONFIGS = {
    "mistral": lambda v: T.MistralConfig(vocab_size=v, hidden_size=64, num_key_value_heads=2,
                                         **SMALL),
    "phi": lambda v: T.PhiConfig(vocab_size=v, hidden_size=64, **SMALL),
    "qwen3": lambda v: T.Qwen3Config(vocab_size=v, hidden_size=64, num_key_value_heads=2,
                                     head_dim=16, **SMALL),
    "gpt2": lambda v: T.GPT2Config(vocab_size=v, n_embd=64, n_layer=3, n_head=4, n_positions=256,
                                   bos_token_id=1, eos_token_id=1),
}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_greedy_equals_generate_for_other_architectures(arch, attn, device):
    tok = build_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(CONFIGS[arch](len(tok)),
                                             attn_implementation=attn).eval()
    spread(model, seed=3)
    model.to(device)
    prompts = ["12+34=", "hello world ", "abc"]
    rs = [make(tok, p, temperature=0.0, max_new_tokens=30) for p in prompts]
    eng = TorchEngine(model, tok, max_batch=2)
    eng.add(rs[:1])
    eng.step()
    eng.add(rs[1:])  # joins while the first is 3 tokens in
    while eng.pending():
        eng.step()
    model.generation_config.eos_token_id = None  # run the full 30 tokens like the engine
    gc = GenerationConfig(do_sample=False, max_new_tokens=30, pad_token_id=0)
    for r, p in zip(rs, prompts, strict=True):
        ids = torch.tensor([tok.encode(p)], device=device)
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
        assert r.response_tokens == ref[0, ids.shape[1]:].tolist()
    assert len(set(rs[0].response_tokens)) > 5  # a varied sequence, not one repeated token
