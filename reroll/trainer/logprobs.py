"""Per-token log-probabilities and entropies of a causal LM, computed chunk by chunk.

Owns the math from a model's last hidden states to ``log pi(target)`` and the entropy of
``pi`` at a temperature, without ever holding the ``[batch, length, vocab]`` logits: the
hidden states ``[B*L, H]`` are cut into chunks of rows, each chunk's logits ``[c, V]`` are
made, reduced to two numbers per row and dropped. Under autograd each chunk runs in
``torch.utils.checkpoint``, so the backward pass also recomputes one chunk's logits at a
time. With a 151,936-token vocabulary, 8 x 1,024 tokens of fp32 logits are 5 GB (and
log_softmax and its gradient as much again); a chunk of 883 rows is 0.5 GB.

Also owns how a transformers causal LM splits into its decoder and its output embedding
(`split_head`), which post-processing of the logits is reproduced (Gemma's softcapping,
Cohere's and Granite's logit scales), and which makes it fall back to the full logits.
Must not know about batches, losses or the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

# chunk = 0 ("auto"): as many rows as keep one chunk's logits under this many elements
# (512 MiB in fp32): 883 rows at a 151,936-token vocabulary; the ~100-token vocabulary of
# the tiny models never needs a second chunk.
AUTO_ELEMENTS = 2**27

# Config attributes of logits post-processing that `Head` does not reproduce: such models
# take the full-logits path (checked against every *ForCausalLM of transformers 5.23).
UNHANDLED_ATTRS = (
    "logits_soft_cap",  # RecurrentGemma: its own softcap attribute
    "unpadded_vocab_size",  # Inkling: logits cut to the unpadded vocabulary
    "logits_mup_width_multiplier",  # Inkling: hidden states rescaled before the head
)
# Model types whose head is not "output embedding of the last hidden state": ProphetNet
# predicts n-grams, Git drops its image-token positions, xLSTM post-processes in chunks.
UNHANDLED_TYPES = {"prophetnet", "git", "xlstm"}


@dataclass(frozen=True)
class Head:
    """How a causal LM's logits come from its decoder: ``logits = post(proj(decoder(x)))``."""

    decoder: nn.Module  # input_ids, attention_mask -> last hidden state [B, L, H]
    proj: nn.Module  # the output embedding: [..., H] -> [..., V]
    scale: float = 1.0  # logits * scale (Cohere's logit_scale)
    divisor: float = 1.0  # logits / divisor (Granite's and MiniCPM3's logits_scaling)
    softcap: float | None = None  # cap * tanh(logits / cap) (Gemma 2/3's final_logit_softcapping)

    def logits(self, hidden: Tensor) -> Tensor:
        """hidden [..., H] -> float32 logits [..., V], post-processed as the model does."""
        z = self.proj(hidden).float()
        if self.scale != 1.0:
            z = z * self.scale
        if self.divisor != 1.0:
            z = z / self.divisor
        if self.softcap is not None:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z


def text_config(model: nn.Module):
    """The config of a model's language part (a multimodal model's text config, else its own)."""
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def split_head(model: nn.Module) -> Head | None:
    """The decoder and output embedding of a transformers causal LM, or None where the logits
    cannot be rebuilt from them (then use the full logits of ``model(...)``).

    The decoder is ``model.base_model`` (the module named by ``base_model_prefix``: ``model``
    for Llama/Qwen2/Mistral/Gemma, ``transformer`` for GPT-2), whose first output is the last
    hidden state the model's own forward feeds to its output embedding."""
    decoder = getattr(model, "base_model", None)
    get_proj = getattr(model, "get_output_embeddings", None)
    proj = get_proj() if get_proj is not None else None
    if decoder is None or decoder is model or not isinstance(proj, nn.Linear):
        return None  # no separate decoder, or a head that is not one linear map
    if not any(child is proj for child in model.children()):
        # BERT-style decoders (RoFormer, MegatronBert, ...) apply a transform (dense,
        # activation, norm) before the output embedding nested in their prediction head
        return None
    cfg = text_config(model)
    if getattr(cfg, "model_type", "") in UNHANDLED_TYPES:
        return None
    if any(getattr(cfg, a, None) is not None for a in UNHANDLED_ATTRS):
        return None
    scale = getattr(model, "logit_scale", None)  # Cohere keeps it on the model (a float)
    if scale is not None and not isinstance(scale, (int, float)):
        return None  # a learned or tensor scale: not reproduced
    return Head(decoder=decoder, proj=proj, scale=float(scale or 1.0),
                divisor=float(getattr(cfg, "logits_scaling", None) or 1.0),
                softcap=getattr(cfg, "final_logit_softcapping", None))


def chunk_rows(chunk: int, vocab: int) -> int:
    """Rows (tokens) per chunk: ``chunk``, or with 0 as many as fit `AUTO_ELEMENTS`."""
    return chunk if chunk > 0 else max(1, AUTO_ELEMENTS // max(1, vocab))


def logprobs_from_logits(logits: Tensor, targets: Tensor, temperature: float = 1.0,
                         entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """logits [..., V], targets [...] -> (log pi(target) [...], entropy [...] or None), fp32.

    ``pi = softmax(logits / temperature)`` (temperature 0 or 1: the logits as they are), the
    distribution the engine samples from at top_p = 1, top_k = 0. The entropy
    ``-sum_v pi_v log pi_v`` is a measurement: it carries no gradient."""
    z = logits.float()
    if temperature not in (0.0, 1.0):
        z = z / temperature
    logp_all = torch.log_softmax(z, dim=-1)  # [..., V]
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [...]
    if not entropy:
        return logp, None
    with torch.no_grad():
        p = logp_all.exp()
        # p * log p is 0 where p is 0 (a logit of -inf would give 0 * -inf = nan)
        ent = -torch.where(p > 0, p * logp_all, 0.0).sum(-1)  # [...]
    return logp, ent


def chunked_logprobs(hidden: Tensor, head: Head, targets: Tensor, temperature: float = 1.0,
                     chunk: int = 0, entropy: bool = True) -> tuple[Tensor, Tensor | None]:
    """hidden [B, L, H], targets [B, L-1] (``input_ids[:, 1:]``) -> (log-probs [B, L-1],
    entropies [B, L-1] or None), at most ``chunk_rows(chunk, V)`` rows of logits at a time.

    All B*L positions go through the head (the last one of each row predicts nothing and is
    dropped), so a batch that fits one chunk computes exactly what ``model(...).logits``
    does, bit for bit, with no checkpoint (its logits are no larger than one chunk's)."""
    B, L, H = hidden.shape
    n = B * L
    rows = chunk_rows(chunk, head.proj.out_features)
    h = hidden.reshape(n, H)  # [N, H] (a view)
    t = nn.functional.pad(targets, (0, 1)).reshape(n)  # [N]: target 0 at each row's end

    def one(h_c: Tensor, t_c: Tensor) -> tuple[Tensor, Tensor | None]:  # [c, H], [c]
        return logprobs_from_logits(head.logits(h_c), t_c, temperature, entropy)

    if n <= rows:
        logp, ent = one(h, t)
    else:
        grad = torch.is_grad_enabled()
        parts = [checkpoint(one, h[s:s + rows], t[s:s + rows], use_reentrant=False) if grad
                 else one(h[s:s + rows], t[s:s + rows]) for s in range(0, n, rows)]
        logp = torch.cat([p[0] for p in parts])  # [N]
        ent = torch.cat([p[1] for p in parts]) if entropy else None
    logp = logp.view(B, L)[:, :-1]  # [B, L-1]
    return logp, (ent.view(B, L)[:, :-1] if ent is not None else None)


def model_logprobs(model: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                   targets: Tensor, temperature: float = 1.0, chunk: int = 0,
                   entropy: bool = False) -> tuple[Tensor, Tensor | None]:
    """input_ids, attention_mask [B, L], targets [B, L-1] -> (log-probs [B, L-1], entropies
    [B, L-1] or None): chunked where `split_head` knows the model, else from the full logits."""
    head = split_head(model)
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B, L, V]
        return logprobs_from_logits(logits[:, :-1], targets, temperature, entropy)
    hidden = head.decoder(input_ids=input_ids, attention_mask=attention_mask,
                          use_cache=False)[0]  # [B, L, H]
    return chunked_logprobs(hidden, head, targets, temperature, chunk, entropy)
