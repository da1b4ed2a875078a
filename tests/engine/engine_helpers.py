"""Shared helpers of the engine tests (imported by name: tests/engine is on sys.path)."""

import torch
from float_bounds import reorder_atol

from reroll.rollout import Rollout, SamplingParams

PROMPTS = ["12+34=", "hello world ", "7*8=", "abc", "(1+2)*3=?", "z", "sort: 9 1 5 3 -> "]


def spread(model, seed: int, std: float = 0.15) -> None:
    """Re-draw every matrix of ``model`` from N(0, std^2) (norm gains stay 1), so that greedy
    outputs are long and varied (a default random init repeats one character)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def make(tok, text: str, gid: str = "", **sampling) -> Rollout:
    ids = tok.encode(text)
    return Rollout(prompt_id=text, group_id=gid or text, tokens=list(ids), prompt_len=len(ids),
                   sampling=SamplingParams(**sampling))


def full_logprobs(model, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    """log_softmax(logits / T) of each token given its prefix, one full forward on the
    model's device: [len-1], on the CPU."""
    ids = torch.tensor([tokens], device=model.device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1).cpu()


def forward_atol(model, scale: float) -> float:
    """Tolerance between two forwards of the same tokens through kernels of other shapes
    (prefill vs decode, a draft's extend step, another batch): `float_bounds.reorder_atol`
    with the model's longest reduction as ``n_terms`` (its width, MLP width or vocabulary:
    the log-softmax's normaliser) and ``depth`` 5 chained reductions a layer (q/k/v
    projections, attention's weighted sum, output projection, MLP up and down) plus the
    output embedding and the normaliser, at ``scale`` (the compared values' magnitude).
    Not bitwise: a CPU's BLAS blocks each shape its own way (AVX2, AVX-512, AMX)."""
    c = model.config
    n = max(c.hidden_size, c.intermediate_size, c.vocab_size)
    return reorder_atol(n, scale, depth=5 * c.num_hidden_layers + 2)


def assert_sampled_as(r: Rollout, plain: Rollout, model) -> None:
    """``r`` holds exactly the tokens, versions and loss mask of ``plain`` and log-probs
    within `forward_atol` (kernels of other shapes), all of them sampled (no draft span).
    Token equality is the point: both draw each token by inverse CDF from the same uniform
    (the request's seed and position), from distributions that differ by rounding only, so
    a token differs only where a uniform falls within that rounding of a CDF boundary (per
    token, odds no larger than the CDF's rounding difference); a failure here is almost
    surely a different distribution, not rounding."""
    assert r.tokens == plain.tokens
    assert r.loss_mask == plain.loss_mask and r.versions == plain.versions
    want = torch.tensor(plain.logprobs)
    torch.testing.assert_close(torch.tensor(r.logprobs), want, rtol=0.0,
                               atol=forward_atol(model, want))
    assert [s.source for s in r.spans] == ["prompt", "sampled"]
