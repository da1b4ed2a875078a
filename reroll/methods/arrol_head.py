"""ARRoL's training side: the quality head learns beside the policy, in each step.

The head's step (`head_step`) is one step of mean binary cross-entropy against "the finished
sample was a success", on features detached from the policy, so the head never moves it.

`ArrolTrainer` is a `TrainerHandle` around a `Trainer` (the ``trainer`` trait of the
``arrol`` pruner, `reroll.methods.arrol`). Its step: (1) the step's finished, labelled
samples (not pruned, not replayed copies) go through a no-grad forward of the policy over
their prefix up to the prediction position ``k = min(at, L - 1)`` (`features_at`,
`prefix_hidden`: prompt + k tokens, so the pass is short whatever the response length),
whose last hidden state is the feature the engine used (with the prefix's recorded
log-probs, the very numbers the engine used); (2) the head takes ``updates`` optimiser
steps of BCE on them (its accuracy, Brier score and BCE on these samples before the first
step are logged); (3) the policy update runs on each group's survivors only (pruned members
leave the group: they are neither in the loss nor in the advantages' baseline). The head's
weights, optimiser and sample count go into checkpoints (``arrol_head.pt``) and reach the
engines with the policy weights (`weights`, keys ``arrol.*``), so engines decide with the
head of the same version. The head itself and its transport are the engine's
(`reroll.engine.quality`). Knows nothing of the pruner's rule or the control loop.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from reroll.engine.quality import QualityHead, head_tensors, prefix_confidence
from reroll.rollout import Group, Rollout
from reroll.trainer import checkpoint
from reroll.trainer.logprobs import split_head
from reroll.trainer.micro_batches import micro_slices
from reroll.trainer.precision import autocast


def head_step(head: QualityHead, opt: torch.optim.Optimizer, h: Tensor, k: Tensor,
              lp: Tensor, y: Tensor) -> dict[str, float]:
    """One step of mean BCE on (h [N, H], k [N], lp [N, 2], y [N] in {0, 1}); returns the
    head's accuracy (p >= 1/2 vs y), Brier score mean (p - y)^2 and BCE on these samples
    before the step, and the BCE after it."""
    logits = head(h.detach(), k, lp)
    y = y.to(logits.device, torch.float32)
    loss = nn.functional.binary_cross_entropy_with_logits(logits, y)
    p = torch.sigmoid(logits.detach())
    out = {"arrol/head_accuracy": float(((p >= 0.5).float() == y).float().mean()),
           "arrol/head_brier": float(((p - y) ** 2).mean()),
           "arrol/head_bce": float(loss.detach())}
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    with torch.no_grad():
        after = nn.functional.binary_cross_entropy_with_logits(head(h, k, lp), y)
    out["arrol/head_bce_after"] = float(after)
    return out


def features_at(response_len: int, at: int) -> int:
    """Position k of a finished sample's prediction: min(at, L - 1)."""
    return max(0, min(at, response_len - 1))


HEAD_FILE = "arrol_head.pt"


@torch.no_grad()
def prefix_hidden(model: torch.nn.Module, rollouts: list[Rollout], at: int, pad_id: int,
                  device: torch.device, micro_batch: int = 64,
                  autocast_dtype: torch.dtype | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h [N, H] float32, k [N], lp [N, 2]): each sample's final hidden state (the input of
    the output embedding) after its prompt and first ``k = min(at, L - 1)`` response tokens,
    and the mean and min of those tokens' behaviour log-probs."""
    ks = [features_at(r.response_len, at) for r in rollouts]
    seqs = [r.tokens[:r.prompt_len + k] for r, k in zip(rollouts, ks)]
    head = split_head(model)
    out = []
    for s in micro_slices(len(seqs), micro_batch):
        part = seqs[s]
        n = max(len(x) for x in part)
        ids = torch.tensor([x + [pad_id] * (n - len(x)) for x in part], device=device)
        att = torch.tensor([[1] * len(x) + [0] * (n - len(x)) for x in part], device=device)
        last = torch.tensor([len(x) - 1 for x in part], device=device)
        with autocast(device, autocast_dtype):
            if head is not None:
                hid = head.decoder(input_ids=ids, attention_mask=att, use_cache=False)[0]
            else:  # the output embedding's input, from the full forward
                hid = _embedding_input(model, ids, att)
        out.append(hid[torch.arange(len(part), device=device), last].float())  # [b, H]
    lp = [prefix_confidence(r.logprobs[r.prompt_len:r.prompt_len + k])
          for r, k in zip(rollouts, ks)]
    return torch.cat(out), torch.tensor(ks, device=device), torch.tensor(lp, device=device)


def _embedding_input(model: torch.nn.Module, ids: torch.Tensor, att: torch.Tensor
                     ) -> torch.Tensor:
    """[B, L, H]: what the output embedding takes in a full forward (for models whose head
    `split_head` cannot split off)."""
    got = []
    hook = model.get_output_embeddings().register_forward_pre_hook(
        lambda mod, args: got.append(args[0]))
    try:
        model(input_ids=ids, attention_mask=att)
    finally:
        hook.remove()
    return got[0]


class ArrolTrainer:
    """The policy update of ``inner`` on survivors, and the quality head's update (see the
    module docstring); ``pruner``: the `reroll.methods.arrol.ARRoL` of the run."""

    def __init__(self, inner, pruner, *, seed: int = 0, ckpt: Path | None = None):
        self.inner, self.at = inner, pruner.at
        self.warmup, self.updates = pruner.warmup, pruner.updates
        width = inner.model.get_output_embeddings().in_features
        self.head = QualityHead(width, pruner.at, pruner.hidden, seed=seed,
                                confidence=pruner.confidence).to(inner.device)
        self.opt = torch.optim.Adam(self.head.parameters(), lr=pruner.lr)
        self.seen = 0  # labelled samples the head has trained on
        if ckpt is not None:
            saved = checkpoint.read_extra(ckpt, HEAD_FILE)
            self.head.load_state_dict(saved["head"])
            self.opt.load_state_dict(saved["opt"])
            self.seen = int(saved["seen"])

    @property
    def version(self) -> int:
        return self.inner.version

    @property
    def warm(self) -> bool:
        return self.seen >= self.warmup

    def step(self, groups: list[Group], referenced: set[int] | None = None
             ) -> dict[str, float]:
        t0 = time.perf_counter()
        labelled = [r for g in groups for r in g.rollouts if r.finish != "pruned"
                    and not r.reused and "correct" in r.control.get("arrol", {})]
        metrics: dict[str, float] = {}
        if labelled:
            i, o = self.inner, self.inner.options
            h, k, lp = prefix_hidden(i.model, labelled, self.at, o.pad_id, i.device,
                                     o.micro_batch, o.autocast_dtype)
            y = torch.tensor([float(r.control["arrol"]["correct"]) for r in labelled],
                             device=i.device)
            for u in range(self.updates):
                m = head_step(self.head, self.opt, h, k, lp, y)
                if u == 0:  # accuracy, Brier and BCE before the first step
                    metrics.update(m)
            metrics["arrol/head_bce_after"] = m["arrol/head_bce_after"]
            self.seen += len(labelled)
            metrics["arrol/label_mean"] = float(y.mean())
        metrics.update({"arrol/head_samples": float(len(labelled)),
                        "arrol/head_seen": float(self.seen),
                        "arrol/head_warm": float(self.warm),
                        "arrol/head_s": time.perf_counter() - t0})
        survivors = [replace(g, rollouts=[r for r in g.rollouts if r.finish != "pruned"])
                     for g in groups]
        return {**self.inner.step(survivors, referenced), **metrics}

    # ---- the rest of TrainerHandle ------------------------------------------------------
    def head_weights(self) -> dict[str, torch.Tensor]:
        """The head as the engines take it (`reroll.engine.quality.head_tensors`)."""
        return head_tensors(self.head, self.warm)

    def weights(self, trained_only: bool = False,
                adapters: bool = False) -> dict[str, torch.Tensor]:
        return {**self.inner.weights(trained_only, adapters), **self.head_weights()}

    def save_checkpoint(self, run_dir: Path, step: int, state: dict[str, Any],
                        groups: list[Group]) -> Path:
        head = {"head": self.head.state_dict(), "opt": self.opt.state_dict(),
                "seen": self.seen}
        return self.inner.save_checkpoint(run_dir, step, state, groups,
                                          extras={HEAD_FILE: head})

    def policy(self) -> torch.nn.Module:
        return self.inner.policy()

    def close(self) -> None:
        self.inner.close()
