"""Chunked log-probabilities equal the full-logits path (values and gradients within the
rounding bound of sums taken in another order, `tests/float_bounds.py`; bitwise at the default
chunk on the tiny model, where the kernels and shapes are the same), the entropy is the hand-computed
one, the `[batch, length, vocab]` logits are never made, and logits post-processing
(softcapping, logit scales) is reproduced or falls back to the full logits."""

import math

import pytest
import torch
import transformers as T
from float_bounds import assert_reordered_close
from transformers import AutoModelForCausalLM

from reroll.models import build_tokenizer
from reroll.trainer.batch import collate, token_logprobs, token_logprobs_and_entropy
from reroll.trainer.logprobs import (
    Head,
    chunked_logprobs,
    logprobs_from_logits,
    model_logprobs,
    split_head,
)

SMALL = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, max_position_embeddings=64)
CONFIGS = {  # tiny random-init models of several families (vocabulary: the char tokenizer's)
    "qwen2": lambda v: T.Qwen2Config(vocab_size=v, hidden_size=64, **SMALL),
    "llama": lambda v: T.LlamaConfig(vocab_size=v, hidden_size=64, **SMALL),
    "gpt2": lambda v: T.GPT2Config(vocab_size=v, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                   bos_token_id=1, eos_token_id=1),
    # post-processed logits: softcap small enough to bend them, non-trivial scales
    "gemma2": lambda v: T.Gemma2Config(vocab_size=v, hidden_size=64, head_dim=16,
                                       final_logit_softcapping=1.5, **SMALL),
    "cohere": lambda v: T.CohereConfig(vocab_size=v, hidden_size=64, logit_scale=0.5, **SMALL),
    "granite": lambda v: T.GraniteConfig(vocab_size=v, hidden_size=64, logits_scaling=3.0,
                                         **SMALL),
}


def tiny_model(arch: str, device: torch.device, seed: int = 0):
    """Initialised on the CPU (the same weights whatever the device), then moved."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(CONFIGS[arch](len(build_tokenizer()))).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # larger weights than the default init: peaked, varied logits
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.to(device)


def inputs(device: torch.device, B: int = 3, L: int = 11, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, 90, (B, L), generator=g)  # [B, L]
    att = torch.ones(B, L, dtype=torch.long)
    att[1, L - 3:] = 0  # a right-padded row
    ids, att = ids.to(device), att.to(device)
    return ids, att, ids[:, 1:]


def full_path(model, ids, att, targets, temperature=1.0):
    """The reference: the model's own [B, L, V] logits."""
    logits = model(input_ids=ids, attention_mask=att).logits[:, :-1]  # [B, L-1, V]
    return logprobs_from_logits(logits, targets, temperature)


@pytest.mark.parametrize("arch", sorted(CONFIGS))
def test_chunked_logprobs_and_entropy_equal_the_full_logits(arch, device):
    model = tiny_model(arch, device)
    assert split_head(model) is not None, arch  # every family here takes the chunked path
    ids, att, tg = inputs(device)  # 3 x 11 = 33 positions
    with torch.no_grad():
        want_lp, want_ent = full_path(model, ids, att, tg, temperature=0.7)
        for chunk in (1, 2, 7, 32, 33, 1000, 0):  # 1000: one chunk larger than the batch
            lp, ent = model_logprobs(model, ids, att, tg, 0.7, chunk=chunk, entropy=True)
            # another chunk is another matrix shape (one row: a matrix-vector product), whose
            # sums run in another order: a logit sums hidden_size products, the log-sum-exp
            # and the entropy sum over the vocabulary, the largest of these reductions
            n = max(model.config.vocab_size, model.config.hidden_size)
            assert_reordered_close(lp, want_lp, n, msg="logprobs")
            assert_reordered_close(ent, want_ent, n, msg="entropy")


@pytest.mark.parametrize("arch", ["qwen2", "llama", "gpt2"])
def test_chunked_gradients_equal_the_full_logits_gradients(arch, device):
    model = tiny_model(arch, device)
    ids, att, tg = inputs(device)
    w = torch.randn(tg.shape, generator=torch.Generator().manual_seed(2)).to(device)  # [B, L-1]

    def grads(fn):
        model.zero_grad(set_to_none=True)
        (fn() * w).sum().backward()
        return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    want = grads(lambda: full_path(model, ids, att, tg)[0])
    # the paths differ only in the output head's shapes: its backward sums the vocabulary
    # (d hidden = d logits @ W) and the positions (d W = d logits^T @ hidden) in other orders;
    # the layers below run the same kernels on the same shapes and carry that difference down
    # at the size of the gradients they produce, which the bound's scale (each tensor's
    # largest gradient) measures. Not bitwise: a CPU's BLAS blocks each shape its own way.
    n = max(model.config.vocab_size, tg.numel())
    for chunk in (1, 5, 1000):
        got = grads(lambda c=chunk: model_logprobs(model, ids, att, tg, chunk=c)[0])
        assert got.keys() == want.keys()
        for k in want:
            assert_reordered_close(got[k], want[k], n, msg=k)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_default_chunk_is_bitwise_the_full_path_on_the_tiny_models(arch, device):
    """The tiny models take one chunk at the default size (0: 2^27 logits), computed exactly
    as before chunking existed: same bits for log-probs and gradients (the loop tests'
    bitwise equivalences rest on this)."""
    from reroll.config import ModelConfig
    from reroll.models.tiny import build_model_config

    tok = build_tokenizer()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_model_config(
        ModelConfig(arch=arch), len(tok), tok.pad_token_id, tok.eos_token_id, tok.bos_token_id))
    model.to(device)
    ids, att, tg = inputs(device, B=64, L=20)  # the size of a default micro-batch

    def run(fn):
        model.zero_grad(set_to_none=True)
        lp = fn()
        lp.sum().backward()
        return lp.detach(), [p.grad.clone() for p in model.parameters()]

    old = run(lambda: torch.log_softmax(model(input_ids=ids, attention_mask=att)
                                        .logits[:, :-1].float(), -1)
              .gather(-1, tg.unsqueeze(-1)).squeeze(-1))
    new = run(lambda: model_logprobs(model, ids, att, tg, entropy=True)[0])
    assert torch.equal(old[0], new[0])
    assert all(torch.equal(a, b) for a, b in zip(old[1], new[1], strict=True))


def test_entropy_and_logprob_by_hand(device):
    # A head whose logits are known: hidden states are one-hot rows e_i, the output
    # embedding's weight W [V=3, H=2] has W[:, i] = the logits of e_i.
    #   row 0: logits ln[1, 2, 3] -> p = [1/6, 2/6, 3/6]
    #     H = 1/6 ln 6 + 1/3 ln 3 + 1/2 ln 2 = 0.2986266 + 0.3662041 + 0.3465736 = 1.0114043
    #     target 2: log p = ln(1/2) = -0.693147
    #   row 1: logits [0, 0, ln 2] -> p = [1/4, 1/4, 1/2]
    #     H = 2 * 1/4 ln 4 + 1/2 ln 2 = 0.693147 + 0.346574 = 1.039721
    #     target 0: log p = ln(1/4) = -1.386294
    W = torch.tensor([[math.log(1), 0.0], [math.log(2), 0.0], [math.log(3), math.log(2)]])
    proj = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        proj.weight.copy_(W)
    head = Head(decoder=torch.nn.Identity(), proj=proj.to(device))
    # one sequence of 3 positions: e_0, e_1, then a last position that predicts nothing
    hidden = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]], device=device)  # [1, 3, 2]
    targets = torch.tensor([[2, 0]], device=device)  # [1, 2]
    for chunk in (1, 2, 0):
        lp, ent = chunked_logprobs(hidden, head, targets, chunk=chunk)
        torch.testing.assert_close(lp.cpu(), torch.tensor([[-0.693147, -1.386294]]), atol=1e-6,
                                   rtol=0)
        torch.testing.assert_close(ent.cpu(), torch.tensor([[1.011404, 1.039721]]), atol=1e-6,
                                   rtol=0)
    # temperature 2, row 0: logits ln[1, 2, 3] / 2 -> p proportional to [1, sqrt 2, sqrt 3]
    #   = [1, 1.414214, 1.732051] / 4.146264 = [0.241181, 0.341081, 0.417738]
    #   H = 0.241181 * 1.422208 + 0.341081 * 1.075634 + 0.417738 * 0.872902
    #     = 0.343010 + 0.366878 + 0.364644 = 1.074532;  target 2: log p = -0.872902
    lp, ent = chunked_logprobs(hidden, head, targets, temperature=2.0, chunk=1)
    torch.testing.assert_close(ent[0, 0].cpu(), torch.tensor(1.074532), atol=1e-6, rtol=0)
    torch.testing.assert_close(lp[0, 0].cpu(), torch.tensor(-0.872902), atol=1e-6, rtol=0)
    # a logit of -inf (a banned token): p = [1/2, 1/2, 0], 0 * log 0 counts as 0: H = ln 2
    lp, ent = logprobs_from_logits(torch.tensor([0.0, 0.0, float("-inf")], device=device),
                                   torch.tensor(0, device=device))
    torch.testing.assert_close(ent.cpu(), torch.tensor(math.log(2)), atol=1e-6, rtol=0)
    torch.testing.assert_close(lp.cpu(), torch.tensor(-math.log(2)), atol=1e-6, rtol=0)


def test_the_full_logits_tensor_is_never_made(device):
    """Every call of the output embedding, in the forward pass and in the backward pass's
    recomputation, makes at most ``chunk`` rows of logits; and no tensor autograd keeps for
    the backward pass holds more than ``chunk`` rows of vocabulary-sized values."""
    model = tiny_model("qwen2", device)
    ids, att, tg = inputs(device, B=4, L=16)  # 64 positions
    V, chunk = model.config.vocab_size, 10
    rows = []
    model.get_output_embeddings().register_forward_hook(
        lambda mod, inp, out: rows.append(out.shape[:-1].numel()))
    saved = []

    def pack(t):
        if t.dim() and t.shape[-1] == V:
            saved.append(t.numel() // V)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = model_logprobs(model, ids, att, tg, chunk=chunk)
    n_forward = len(rows)
    assert n_forward == math.ceil(64 / chunk)
    lp.sum().backward()
    assert len(rows) == 2 * n_forward  # the backward pass recomputed each chunk once
    assert max(rows) <= chunk and max(saved, default=0) <= chunk, (rows, saved)


def test_postprocessing_that_is_not_reproduced_falls_back_to_the_full_logits(device):
    # a BERT-style decoder: its output embedding sits inside a prediction head that first
    # applies dense + activation + norm, so the chunked path would give wrong logits
    torch.manual_seed(0)
    model = T.BertLMHeadModel(T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, intermediate_size=64,
                                           is_decoder=True)).eval().to(device)
    assert split_head(model) is None
    cfg = CONFIGS["qwen2"](100)
    cfg.logits_soft_cap = 5.0  # an attribute of post-processing that is not reproduced
    assert split_head(AutoModelForCausalLM.from_config(cfg)) is None
    ids, att, tg = inputs(device)
    with torch.no_grad():
        torch.testing.assert_close(model_logprobs(model, ids, att, tg, chunk=1)[0],
                                   full_path(model, ids, att, tg)[0], rtol=0, atol=1e-6)


def test_token_logprobs_keeps_its_signature_and_returns_the_entropy_too(tiny, device):
    from reroll.rollout import Rollout

    model, _ = tiny
    model.to(device)
    r = Rollout(prompt_id="p", group_id="g", tokens=[2, 5, 6], prompt_len=2)
    r.append(7, -1.0, 0)
    batch = collate([r], pad_id=0).to(device)
    with torch.no_grad():
        lp = token_logprobs(model, batch, 0.5)
        lp2, ent = token_logprobs_and_entropy(model, batch, 0.5, chunk=1)
    assert lp.shape == ent.shape == (1, 3)
    # one chunk of one row against the whole logits: other matrix shapes, sums of at most
    # vocabulary-many terms in another order
    assert_reordered_close(lp2, lp, max(model.config.vocab_size, model.config.hidden_size))
    assert bool((ent > 0).all()) and bool((ent <= math.log(model.config.vocab_size)).all())
