"""Batch collation: rollouts -> padded tensors aligned on next-token positions (pure).

Owns the one place where the flat token layout of `Rollout` becomes tensors. A sequence of
L tokens gives L-1 prediction positions: position t predicts ``tokens[t+1]`` from the prefix
``tokens[:t+1]``, so every per-token tensor here is the record's field shifted by one
(``loss_mask[1:]``, ``logprobs[1:]``, ``versions[1:]``). Right padding; padded positions have
mask 0. Must not know about losses; the model math of `token_logprobs` lives in
`reroll.trainer.logprobs`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reroll.rollout import Group, Rollout
from reroll.trainer.logprobs import model_logprobs


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, L] long, right-padded
    attention_mask: torch.Tensor  # [B, L] long
    targets: torch.Tensor  # [B, L-1] long: input_ids[:, 1:]
    mask: torch.Tensor  # [B, L-1] float: 1 where the target token was sampled by the policy
    behav_logprobs: torch.Tensor  # [B, L-1] float: engine log-prob of each target token
    versions: torch.Tensor  # [B, L-1] long: policy version of each target token (-1 if none)
    prompt_lens: torch.Tensor | None = None  # [B] long: tokens of each row's prompt
    prompt_ids: torch.Tensor | None = None  # [B] long: rows with equal ids share the prompt

    @property
    def n_tokens(self) -> float:
        return float(self.mask.sum())

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, idx: slice | torch.Tensor) -> Batch:
        return Batch(*(None if (v := getattr(self, f)) is None else v[idx]
                       for f in self.__dataclass_fields__))

    def trim(self) -> Batch:
        """The batch cut to its longest sequence (right padding: the columns dropped hold
        padding only, which a causal model's real positions never attend to); itself when
        no column is all padding."""
        width = self.input_ids.shape[1]
        n = min(width, max(2, int(self.attention_mask.sum(-1).max()))) if len(self) else width
        if n == width:
            return self
        return Batch(self.input_ids[:, :n], self.attention_mask[:, :n], self.targets[:, :n - 1],
                     self.mask[:, :n - 1], self.behav_logprobs[:, :n - 1],
                     self.versions[:, :n - 1], self.prompt_lens, self.prompt_ids)

    def to(self, device: torch.device | str) -> Batch:
        """Every tensor on ``device`` (collated on the CPU, then copied; no copy on the CPU)."""
        return Batch(*(None if (v := getattr(self, f)) is None else v.to(device, non_blocking=True)
                       for f in self.__dataclass_fields__))


def flatten(groups: Sequence[Group]
            ) -> tuple[list[Rollout], torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch's rows before `collate` pads them: rollouts in group order, rewards [N], reward components [N, K], group index [N]."""
    rollouts, rewards, comps, gidx = [], [], [], []
    for g_i, g in enumerate(groups):
        for r in g.rollouts:
            if r.reward is None:
                raise ValueError(f"rollout {r.sample_id} of group {g.group_id} has no reward "
                                 f"(failed or unscored); failed groups must be dropped upstream")
            rollouts.append(r)
            rewards.append(r.reward)
            comps.append([s.value for s in r.scores] or [r.reward])
            gidx.append(g_i)
    return (rollouts, torch.tensor(rewards, dtype=torch.float32),
            torch.tensor(comps, dtype=torch.float32), torch.tensor(gidx, dtype=torch.long))


def collate(rollouts: Sequence[Rollout], pad_id: int, sample_mask: Sequence[bool] | None = None,
            pad_to: int | None = None) -> Batch:
    """Pad rollouts into a Batch. ``sample_mask[i] = False`` zeroes row i's loss mask (a sample
    kept for its group statistics but excluded from the loss, e.g. an MC-GRPO pivot)."""
    if not rollouts:
        raise ValueError("collate: no rollouts")
    L = max(len(r.tokens) for r in rollouts)
    if pad_to is not None:
        L = max(L, pad_to)
    ids, att, mask, behav, vers = [], [], [], [], []
    prompts: dict[tuple[int, ...], int] = {}  # prompt tokens -> id (rows sharing a prompt)
    pids = [prompts.setdefault(tuple(r.tokens[:r.prompt_len]), len(prompts)) for r in rollouts]
    for i, r in enumerate(rollouts):  # rows padded as Python lists: one tensor per field
        pad = L - len(r.tokens)
        keep = r.loss_exclusion is None and (sample_mask is None or sample_mask[i])
        ids.append(r.tokens + [pad_id] * pad)
        att.append([1] * len(r.tokens) + [0] * pad)
        mask.append((r.loss_mask if keep else [False] * len(r.tokens)) + [False] * pad)
        behav.append(r.logprobs + [0.0] * pad)
        vers.append(r.versions + [-1] * pad)
    ids = torch.tensor(ids, dtype=torch.long)  # [B, L]
    att = torch.tensor(att, dtype=torch.long)  # [B, L]
    mask = torch.tensor(mask, dtype=torch.float32)  # [B, L]
    behav = torch.tensor(behav, dtype=torch.float32)  # [B, L]
    vers = torch.tensor(vers, dtype=torch.long)  # [B, L]
    return Batch(ids, att, ids[:, 1:], mask[:, 1:], behav[:, 1:], vers[:, 1:],
                 torch.tensor([r.prompt_len for r in rollouts], dtype=torch.long),
                 torch.tensor(pids, dtype=torch.long))


def token_logprobs(model: torch.nn.Module, batch: Batch, temperature: float = 1.0,
                   chunk: int = 0) -> torch.Tensor:
    """Log-prob of each target token under ``model`` at ``temperature``: [B, L-1].

    This is the distribution the engine samples from when top_p = 1 and top_k = 0, so it is
    directly comparable with the recorded behaviour log-probs. The logits are made ``chunk``
    tokens at a time (0: a size from the vocabulary, see `reroll.trainer.logprobs`)."""
    return token_logprobs_and_entropy(model, batch, temperature, chunk, entropy=False)[0]


def token_logprobs_and_entropy(model: torch.nn.Module, batch: Batch, temperature: float = 1.0,
                               chunk: int = 0, entropy: bool = True
                               ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [B, L-1], entropies [B, L-1] of the policy at each position, no gradient;
    None without ``entropy``)."""
    return model_logprobs(model, batch.input_ids, batch.attention_mask, batch.targets,
                          temperature, chunk, entropy)
