"""How a request is sampled: `SamplingParams` and the per-request rules a workflow or a
control policy hands the engine with it (DUET's `StopRule`, a SPEC-RL/DAS `Draft`, DAS's
`SuffixSource`, LATR's `BranchRule`, ARRoL's `PruneRule`).

Owns the shapes and the validity checks of these values; the engine applies them
(`reroll.engine.requests`, `reroll.engine.speculative`, `reroll.engine.branch`,
`reroll.engine.plugins.prune`) and the policies that make them live in `reroll.control` and
`reroll.workflows`. Plain frozen dataclasses (SamplingParams itself is mutable: workflows set
a member's seed or rule), part of every record (`reroll.rollout.Rollout.sampling`), so this
module imports neither torch nor ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StopRule:
    """A per-request stop rule on top of EOS, stop strings and the length limit, decided by a
    control policy (DUET's marker gate, `reroll.methods.duet`) and applied by the engine as it
    samples. Positions count the tokens sampled in the call (the whole response of a
    single-turn sample), across resumes:

    - once the token sequence ``marker`` has been sampled (it ends at position ``k``), the
      request samples ``grace`` more tokens and finishes with "stop" at position ``k +
      grace``;
    - with ``horizon > 0`` and ``keep`` False, a request that has sampled ``horizon`` tokens
      with no marker (and is not finished by EOS or its length limit there) finishes with
      "pruned"; with ``keep`` True it goes on to EOS.

    The engine only follows it: who draws ``keep`` and what a pruned sample is worth lives in
    ``reroll.control``."""

    marker: tuple[int, ...]
    grace: int = 0
    horizon: int = 0
    keep: bool = True

    def __post_init__(self) -> None:
        if not self.marker or self.grace < 0 or self.horizon < 0:
            raise ValueError(f"StopRule needs a non-empty marker, grace >= 0 and horizon >= "
                             f"0, got marker={self.marker}, grace={self.grace}, "
                             f"horizon={self.horizon}")
        object.__setattr__(self, "marker", tuple(int(t) for t in self.marker))


@dataclass(frozen=True)
class BranchRule:
    """LATR's branching rule (two candidate tokens), decided by a workflow and applied
    by the engine as it samples (`reroll.engine.branch`): at every token a request carrying
    it samples, with ``p_top >= p_j`` the two most likely tokens of the distribution sampled
    from (after temperature, top-k, top-p), a child branches off when ``p_j > tau_abs`` and
    ``p_top - p_j < tau_rel``. The child inherits the tokens before that position and takes
    one candidate as a ``"forced"`` token, then samples on with its own seed. ``parent``
    says who takes which: ``"argmax"`` (LATR's rule) the request takes ``top`` (a
    ``"forced"`` token too when it had sampled another) and the child ``j``; ``"sampled"``
    the request keeps the token it sampled and the child takes the candidate it did not
    sample (``top`` when it sampled ``j``, else ``j``).

    Children are spare members handed to the engine with the tree's root (`TorchEngine.branch`)
    and consumed in order; a request with no spares left (or none, or a greedy one) never
    branches.

    LATR's lookahead pruning (`reroll.engine.branch_prune`): ``prune_at`` tokens after a
    child's branch point (its forced token the first), its tokens there and its parent's are
    compared; the child is pruned (back to an unused spare) when their Levenshtein distance
    over the window length is below ``prune_edit``, or their ROUGE-L F1 is above
    ``prune_rouge_l``, or their longest shared suffix over the window length is above
    ``prune_suffix`` (0, 1 and 1: that test off; ``prune_at`` empty: no pruning)."""

    tau_abs: float = 0.15
    tau_rel: float = 0.25
    parent: str = "argmax"
    prune_at: tuple[int, ...] = (20, 30, 50)
    prune_edit: float = 0.4
    prune_rouge_l: float = 1.0
    prune_suffix: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "prune_at", tuple(int(k) for k in self.prune_at))
        if any(k < 1 for k in self.prune_at) or not all(
                0.0 <= x <= 1.0 for x in (self.prune_edit, self.prune_rouge_l,
                                          self.prune_suffix)):
            raise ValueError(f"BranchRule needs prune_at >= 1 and prune_edit, prune_rouge_l, "
                             f"prune_suffix in [0, 1], got prune_at={self.prune_at}, "
                             f"prune_edit={self.prune_edit}, prune_rouge_l="
                             f"{self.prune_rouge_l}, prune_suffix={self.prune_suffix}")
        if not (0.0 <= self.tau_abs < 1.0 and 0.0 < self.tau_rel <= 1.0):
            raise ValueError(f"BranchRule needs 0 <= tau_abs < 1 and 0 < tau_rel <= 1, got "
                             f"tau_abs={self.tau_abs}, tau_rel={self.tau_rel}")
        if self.parent not in ("argmax", "sampled"):
            raise ValueError(f"BranchRule.parent must be \"argmax\" or \"sampled\", got "
                             f"{self.parent!r}")


@dataclass(frozen=True)
class PruneRule:
    """A group-shared pruning checkpoint (ARRoL's pruner, `reroll.methods.arrol`), decided by a
    control policy and applied by the engine: the ``size`` members of one group (same
    ``group_id``) are generated together; when they reach ``at`` sampled response tokens
    the engine predicts each one's success from its hidden state there and retires all but
    ``keep`` of them with finish "pruned". Members that finished before ``at`` always
    survive (with their prediction at their last position). ``settled`` holds the
    ``(index_in_group, prediction, position)`` of members already finished before the
    checkpoint, for an engine that did not see them finish (a run resumed from a
    checkpoint). How the survivors are chosen lives in ``reroll.engine.quality``."""

    at: int
    keep: int
    size: int
    settled: tuple[tuple[int, float, int], ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.keep <= self.size or self.at < 1:
            raise ValueError(f"PruneRule needs at >= 1 and 1 <= keep <= size, got at="
                             f"{self.at}, keep={self.keep}, size={self.size}")
        object.__setattr__(self, "settled", tuple((int(i), float(p), int(k))
                                                  for i, p, k in self.settled))


@dataclass(frozen=True)
class Draft:
    """Tokens proposed for the start of a response (an earlier epoch's response: SPEC-RL;
    a suffix match over recent rollouts: DAS), which the engine verifies
    under the current policy before it samples anything (`reroll.engine.speculative`).

    Draft token ``x_t`` is accepted with probability ``min(1, lenience * p(x_t) / q(x_t))``,
    ``p`` the current policy's sampling distribution and ``q(x_t) = exp(logprobs[t])`` the
    probability the draft was made with (``logprobs`` empty: a deterministic draft, ``q = 1``).
    At the first rejection the engine samples by ``resample`` (`reroll.engine.speculative`):
    ``"residual"`` draws from ``p`` without the drafted token, renormalised; ``"full"`` from
    the whole of ``p`` (SPEC-RL's rule). With ``lenience = 1``, no ``logprobs`` and
    ``"residual"`` the response is distributed exactly as plain sampling from the current
    policy, whatever the draft; recorded ``logprobs`` accept more, lenience > 1 more still,
    and ``"full"`` favours the drafted token, each at a bias.
    ``source`` names where the draft came from (a sample id), for the record."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    lenience: float = 1.0
    source: str = ""
    resample: str = "residual"

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))
        object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        if self.logprobs and len(self.logprobs) != len(self.tokens):
            raise ValueError(f"Draft from {self.source!r}: {len(self.logprobs)} logprobs for "
                             f"{len(self.tokens)} tokens")
        if self.resample not in ("full", "residual"):
            raise ValueError(f"Draft from {self.source!r}: resample must be \"full\" or "
                             f"\"residual\", got {self.resample!r}")
        if not self.lenience >= 1.0:
            raise ValueError(f"Draft from {self.source!r}: lenience must be >= 1, got "
                             f"{self.lenience}")


@dataclass(frozen=True)
class SuffixSource:
    """What a request re-drafts from while it decodes (DAS, `reroll.engine.suffix`): at every
    decode step the longest suffix (``min_match`` .. ``max_match`` tokens) of its response so
    far that occurs in ``responses`` (the prompt's recent responses) is matched and the
    majority continuation after it (shared by at least ``min_count``) is proposed, at most
    ``min(max_draft, draft_len * (1 + generated // mean response length))`` tokens. The
    engine verifies each proposal exactly (q = 1, lenience 1), in the same forward as the
    step's token, so the response is distributed as plain sampling whatever the source."""

    responses: tuple[tuple[int, ...], ...]
    max_match: int = 8
    min_match: int = 1
    min_count: int = 1
    draft_len: int = 4
    max_draft: int = 16

    def __post_init__(self) -> None:
        object.__setattr__(self, "responses",
                           tuple(tuple(int(t) for t in r) for r in self.responses))
        if not (1 <= self.min_match <= self.max_match and self.min_count >= 1
                and 1 <= self.draft_len <= self.max_draft):
            raise ValueError(f"SuffixSource needs 1 <= min_match <= max_match, min_count >= 1 "
                             f"and 1 <= draft_len <= max_draft, got min_match="
                             f"{self.min_match}, max_match={self.max_match}, min_count="
                             f"{self.min_count}, draft_len={self.draft_len}, max_draft="
                             f"{self.max_draft}")


@dataclass
class SamplingParams:
    """How to sample. ``top_k=0`` and ``top_p=1.0`` disable those filters; ``temperature=0``
    is greedy. The behaviour log-prob recorded per token is under the distribution after
    temperature, top-k and top-p (the one actually sampled from)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 32
    stop_token_ids: list[int] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    seed: int | None = None
    stop_rule: StopRule | None = None
    draft: Draft | None = None  # verified before sampling when a call starts a response
    redraft: SuffixSource | None = None  # re-drafted from at every decode step (DAS)
    branch_rule: BranchRule | None = None  # LATR branching, for members of an engine tree
    prune: PruneRule | None = None  # a group-shared pruning checkpoint (ARRoL)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
