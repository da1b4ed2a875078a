"""Shared helpers of the engine tests (imported by name: tests/engine is on sys.path)."""

import torch

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


def assert_sampled_as(r: Rollout, plain: Rollout) -> None:
    """``r`` holds exactly the tokens, versions and loss mask of ``plain`` and log-probs
    within 1e-5 (kernels of other shapes), all of them sampled (no draft span)."""
    assert r.tokens == plain.tokens
    assert r.loss_mask == plain.loss_mask and r.versions == plain.versions
    assert max(abs(a - b) for a, b in zip(r.logprobs, plain.logprobs, strict=True)) < 1e-5
    assert [s.source for s in r.spans] == ["prompt", "sampled"]
