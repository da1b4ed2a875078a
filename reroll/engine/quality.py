"""ARRoL's checkpoint as the engine applies it (the pruning plug-in,
`reroll.engine.plugins.prune`): the quality head the engine runs and the form it travels in,
the rule that picks a group's survivors, and one group's gate. Pure functions and small
classes; knows nothing of slots, caches, trainers or control policies. The method's other
half (the head's training step, what the trainer feeds it) is `reroll.methods.arrol`.

**The quality head** (`QualityHead`): ``p = sigmoid(f([h / |h|; k / at; mean lp; min lp]))``
with ``h`` the policy's final hidden state (the input of its output embedding) after the
prompt and the first ``k`` response tokens (scaled to unit length, so that one Adam step
moves the logit by about ``lr`` times a few units whatever the model's width), ``lp`` the
behaviour log-probs of those ``k`` tokens (`prefix_confidence`: the policy's confidence in
its own prefix, as recorded, so engine and trainer see the same numbers; left out with
``confidence = False``), and ``f`` a linear map (zero-initialised: p = 1/2 everywhere until
it learns) or, with ``hidden > 0``, a one-hidden-layer tanh MLP (seeded init). It reaches
the engines with the policy's weights, keys ``arrol.*`` (`head_tensors`, `split_weights`).

**The pruning rule** (`survivors`). A group of ``n' = size`` members must be cut to
``n = keep`` at the checkpoint. With ``x_i = 2 p_i - 1`` and rewards r_i ~ Bernoulli(p_i)
independent, the expected within-group sum of squares is
``E[sum_S (r_i - mean)^2] = (n (n - 1) + J(S)) / (4 n)``, ``J(S) = sum_S x_i^2 - (sum_S x_i)^2``
(= sum over pairs of P(r_i != r_j) / n), so for a fixed size the balanced group with the
most expected reward variance maximises ``J``. Members that finished before the checkpoint
(``F``, ``finished``) always survive. The other ``m = n - |F|`` survivors are chosen from the
``M`` live members among the ``m + 1`` sets "the ``j`` highest p, then the ``m - j`` lowest
p of the rest" (j = 0..m; among equal p the smaller member index is taken first from either
end): the one with the largest ``J(F + S)``, ties (within 1e-12) to the set whose sorted
member indices are lexicographically smallest.
These sets contain a maximiser of ``J`` over all m-subsets: swapping a chosen ``a`` for an
unchosen ``b`` changes ``J`` by ``2 (b - a)(a - T)``, ``T`` the chosen sum, so at an
optimum no unchosen value lies above a chosen one that is above ``T``, nor below one below
it. With ``m <= 0`` every live member is pruned (the group keeps its ``|F| >= n`` finished
members); with ``M <= m`` none is.

**Warm-up.** Until the head has trained on ``warmup`` samples its predictions mean
nothing, so the live members are cut uniformly at random instead (`random_survivors`):
the ``m`` with the smallest draw ``u_i`` (a hash of the member's sampling seed, so the cut
depends on nothing else running and repeats exactly), ties by index. Random rather than no
pruning: every group then trains ``n`` samples from the first step, the tokens spent per
step do not jump when the head takes over, and the head's training samples are an
unbiased subset of what the policy generates.

`GroupGate` holds one group's decision while its members reach the checkpoint, and writes
``Rollout.control["arrol"]``: ``p`` (prediction), ``at`` (its position k), ``version`` (of
the engine's weights), then ``decision`` ("kept", "pruned", or "finished": ended before the
checkpoint) and ``mode`` ("head" or "random").
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from reroll.rollout import PruneRule, Rollout

TIE = 1e-12
PREFIX = "arrol."  # the head's tensors among the published weights


# ---- the rule ------------------------------------------------------------------------------
def balance(preds: Iterable[float]) -> float:
    """J = sum x^2 - (sum x)^2 with x = 2p - 1 (see the module docstring)."""
    xs = [2.0 * p - 1.0 for p in preds]
    return sum(x * x for x in xs) - sum(xs) ** 2


def survivors(preds: Mapping[int, float], finished: Iterable[int], keep: int) -> list[int]:
    """Sorted indices of the members that survive: every ``finished`` one, and the live ones
    (the rest of ``preds``) the rule of the module docstring picks, ``keep`` in all."""
    fin = sorted(set(finished))
    m = keep - len(fin)
    low = sorted((p, i) for i, p in preds.items() if i not in fin)  # ascending p
    if m <= 0:
        return fin
    if len(low) <= m:
        return sorted(fin + [i for _, i in low])
    high = sorted(low, key=lambda x: (-x[0], x[1]))  # descending p, ties by index
    base = [preds[i] for i in fin]
    best, best_set = -float("inf"), []
    for j in range(m + 1):
        top = {i for _, i in high[:j]}
        chosen = top | {i for _, i in [x for x in low if x[1] not in top][:m - j]}
        score = balance(base + [preds[i] for i in chosen])
        idx = sorted(fin + list(chosen))
        if score > best + TIE or (abs(score - best) <= TIE and idx < best_set):
            best, best_set = max(score, best), idx
    return best_set


def rank_draw(seed: int) -> float:
    """A member's u ~ U[0, 1) for the warm-up cut: a hash of its sampling seed alone."""
    digest = hashlib.sha256(f"arrol-cut:{int(seed)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def random_survivors(draws: Mapping[int, float], finished: Iterable[int], keep: int
                     ) -> list[int]:
    """Warm-up: every finished member, and the live ones with the smallest draws (ties by
    index), ``keep`` in all."""
    fin = sorted(set(finished))
    live = sorted((u, i) for i, u in draws.items() if i not in set(fin))
    return sorted(fin + [i for _, i in live[:max(0, keep - len(fin))]])


# ---- one group's decision ------------------------------------------------------------------
class GroupGate:
    """One group's members as they reach the checkpoint (`arrive`) or finish before it
    (`arrive(..., finished=True)`); once all ``rule.size`` have done one or the other,
    `decide` returns the indices to retire and records every member's fate."""

    def __init__(self, rule: PruneRule):
        self.rule = rule
        self.preds: dict[int, float] = {i: p for i, p, _ in rule.settled}
        self.draws: dict[int, float] = {}
        self.finished: set[int] = {i for i, _, _ in rule.settled}
        self.members: dict[int, Rollout] = {}  # records to write the decision into

    def arrive(self, r: Rollout, p: float, k: int, version: int, finished: bool = False
               ) -> None:
        """``r`` predicted ``p`` at position ``k`` (a member seen again keeps its first
        prediction, e.g. one restored from a checkpoint, and may now be finished)."""
        i = r.index_in_group
        rec = r.control.setdefault("arrol", {})
        if "p" not in rec:
            rec.update(p=float(p), at=int(k), version=int(version))
        self.preds[i] = rec["p"]
        self.draws[i] = rank_draw(r.sampling.seed if r.sampling.seed is not None else i)
        self.members[i] = r
        if finished:
            self.finished.add(i)
            rec["decision"] = "finished"

    @property
    def ready(self) -> bool:
        return len(self.preds) >= self.rule.size

    def decide(self, warm: bool) -> set[int]:
        """Indices pruned (``warm``: by the head's predictions, else the seeded draws); the
        members' records get their decision and the mode."""
        keep = (survivors(self.preds, self.finished, self.rule.keep) if warm else
                random_survivors(self.draws, self.finished, self.rule.keep))
        cut = set(self.preds) - set(keep)
        for i, r in self.members.items():
            rec = r.control["arrol"]
            rec["mode"] = "head" if warm else "random"
            if i not in self.finished:
                rec["decision"] = "pruned" if i in cut else "kept"
        return cut


# ---- the head ------------------------------------------------------------------------------
def prefix_confidence(logprobs: Sequence[float]) -> tuple[float, float]:
    """(mean, min) of a prefix's behaviour log-probs; (0, 0) for an empty prefix."""
    return (sum(logprobs) / len(logprobs), min(logprobs)) if logprobs else (0.0, 0.0)


class QualityHead(nn.Module):
    """Success logit of a partial rollout from the policy's final hidden state ``h`` [N, H]
    (scaled to unit length), its position ``k`` [N] (fraction ``k / at`` as a feature) and,
    with ``confidence``, its prefix's log-prob mean and min ``lp`` [N, 2]
    (`prefix_confidence`)."""

    def __init__(self, width: int, at: int, hidden: int = 0, seed: int = 0,
                 confidence: bool = True):
        super().__init__()
        self.at, self.confidence = int(at), bool(confidence)
        n_in = width + 1 + 2 * self.confidence
        g = torch.Generator().manual_seed(seed)
        if hidden > 0:
            first, last = nn.Linear(n_in, hidden), nn.Linear(hidden, 1)
            with torch.no_grad():
                first.weight.copy_(torch.randn(first.weight.shape, generator=g) / n_in ** 0.5)
                first.bias.zero_()
                last.weight.zero_()
                last.bias.zero_()
            self.net = nn.Sequential(first, nn.Tanh(), last)
        else:
            self.net = nn.Linear(n_in, 1)
            nn.init.zeros_(self.net.weight)
            nn.init.zeros_(self.net.bias)

    def forward(self, h: Tensor, k: Tensor, lp: Tensor) -> Tensor:
        """logits [N] from h [N, H] (any float dtype), positions k [N], lp [N, 2], on the
        head's device (the features are moved there: no-ops when they already are)."""
        dev = next(self.parameters()).device
        h = h.to(dev).float()
        h = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-6)  # [N, H], unit length
        parts = [h, k.to(dev, torch.float32)[:, None] / self.at]  # [N, H], [N, 1]
        if self.confidence:
            parts.append(lp.to(dev, torch.float32))  # [N, 2]
        return self.net(torch.cat(parts, dim=-1)).squeeze(-1)

    def predict(self, h: Tensor, k: Tensor, lp: Tensor) -> Tensor:
        """p [N] in (0, 1), no gradient."""
        with torch.no_grad():
            return torch.sigmoid(self(h, k, lp))


def head_tensors(head: QualityHead, warm: bool) -> dict[str, Tensor]:
    """What the engines receive with the policy weights: the head's parameters (keys
    ``arrol.<name>``), its checkpoint position, its features and whether it is past its
    warm-up."""
    out = {PREFIX + k: v.detach().clone() for k, v in head.state_dict().items()}
    out[PREFIX + "at"] = torch.tensor(head.at)
    out[PREFIX + "confidence"] = torch.tensor(head.confidence)
    out[PREFIX + "warm"] = torch.tensor(bool(warm))
    return out


def head_from_tensors(tensors: Mapping[str, Tensor], width: int
                      ) -> tuple[QualityHead, bool]:
    """(head, warm) back from `head_tensors` (keys with or without the prefix)."""
    t = {k.removeprefix(PREFIX): v for k, v in tensors.items()}
    first = t["net.weight"] if "net.weight" in t else t["net.0.weight"]
    hidden = first.shape[0] if "net.0.weight" in t else 0
    head = QualityHead(width, int(t["at"]), hidden, confidence=bool(t["confidence"]))
    head.load_state_dict({k: v for k, v in t.items() if k.startswith("net.")})
    return head.eval(), bool(t["warm"])


def split_weights(weights: Mapping[str, Tensor]
                  ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(the policy's weights, the head's tensors) of a published state dict."""
    policy = {k: v for k, v in weights.items() if not k.startswith(PREFIX)}
    return policy, {k: v for k, v in weights.items() if k.startswith(PREFIX)}
