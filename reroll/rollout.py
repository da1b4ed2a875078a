"""The records every stage shares: Example, Score, Span, Rollout, Group (and SamplingParams
with its per-request rules, from `reroll.sampling_params`).

Owns the data model (docs/architecture.md). Plain dataclasses with a JSON round trip; this
module must import neither torch nor ray, so that any process (a scoring worker, a Ray
actor, a notebook reading recorded rollouts) can load records cheaply.

Token layout is flat: ``tokens`` holds the whole sequence in order (prompt, sampled tokens,
environment tokens). ``loss_mask``, ``logprobs`` and ``versions`` have one entry per token:
``loss_mask[t]`` is True where the policy sampled token ``t``; ``logprobs[t]`` is the
behaviour log-prob the engine sampled it with (0.0 where not sampled); ``versions[t]`` is the
policy version that produced it (-1 where not sampled). Draft tokens the engine verified and
accepted (span source ``"draft"``) count as sampled: loss mask True, the log-prob and version
of the policy that verified them. A forked child's tokens taken from its parent (span source
``"inherited"``, `reroll.engine.fork`) keep the parent's log-probs, versions and loss mask.
A token the engine chose instead of sampling (span source ``"forced"``: the alternative token
a `BranchRule` child starts with, `reroll.engine.branch`) counts as the policy's too (loss
mask True, its log-prob under the distribution it was chosen from, the version), but was not
drawn from that distribution: the span says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from reroll.sampling_params import (  # re-exported: records and their users import them here
    BranchRule,
    Draft,
    PruneRule,
    SamplingParams,
    StopRule,
    SuffixSource,
)

Finish = Literal["stop", "length", "abort", "pruned", "error", "running"]
Source = Literal["prompt", "sampled", "draft", "inherited", "forced", "replayed", "env"]
FINISHED = ("stop", "length", "pruned", "error")
POLICY_SOURCES = ("sampled", "draft", "inherited", "forced")  # the policy's tokens (loss mask on)


__all__ = ["BranchRule", "Draft", "Example", "FINISHED", "Group", "POLICY_SOURCES",
           "PruneRule", "Rollout", "SamplingParams", "Score", "Span", "StopRule", "SuffixSource",
           "new_id"]


def new_id() -> str:
    """16 random hex digits (64 bits from the OS): as ``uuid4().hex[:16]``, without building
    a UUID (5 us each: ~140 a step on the main job)."""
    return os.urandom(8).hex()


@dataclass
class Example:
    """One task item: what the prompt is and what a verifier needs to judge an answer."""

    prompt_id: str
    prompt: str
    answer: str
    demo: str | None = None  # a correct completion for SFT warm start, when the task has one
    fields: dict[str, Any] = field(default_factory=dict)  # extra columns (test cases, ...)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Example:
        return cls(**d)


@dataclass
class Score:
    """One verifier's verdict: a value or an error, never both; ``info`` holds the parsed
    answer and the reason."""

    name: str
    value: float | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if (self.value is None) == (self.error is None):
            raise ValueError(f"Score {self.name!r} needs exactly one of value or error")

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass
class Span:
    """A contiguous run of tokens with one provenance and one policy version."""

    start: int
    end: int
    source: Source
    version: int = -1


@dataclass
class Rollout:
    """One trajectory (see module docstring for the token layout)."""

    prompt_id: str
    group_id: str
    tokens: list[int]
    prompt_len: int
    loss_mask: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    sample_id: str = field(default_factory=new_id)
    index_in_group: int = 0
    group_round: int = 0  # allocation round that added it to its group (0: the first)
    finish: Finish = "running"
    completion: str = ""  # decoded response text (filled by the engine when it finishes)
    scores: list[Score] = field(default_factory=list)
    reward: float | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    spans: list[Span] = field(default_factory=list)
    parent_id: str | None = None
    prefix_len: int = 0  # tokens inherited from parent_id (replay / speculative reuse)
    resume_count: int = 0
    start_version: int = -1  # policy version when generation of this rollout began
    loss_exclusion: str | None = None  # why this sample is kept out of the loss, if it is
    sample_weight: float = 1.0
    shaping: dict[str, float] = field(default_factory=dict)
    """Reward-shaping terms already added to ``reward`` by a control rule (e.g. DOT's
    ``{"dot": -penalty}``), kept apart from the verifier scores."""
    control: dict[str, Any] = field(default_factory=dict)
    """What control rules decided about this sample, for the record (e.g. DUET's
    ``{"duet": {"marker_at": 3, "horizon": 8, "keep": False, "weight": 1.0, "end":
    "marker_stop"}}``; ARRoL's ``{"arrol": {"p": 0.83, "at": 2, "version": 5, "mode":
    "head", "decision": "kept", "correct": True}}``)."""
    timings: dict[str, float] = field(default_factory=dict)
    old_logprobs: list[float | None] | None = None
    """Per token, the trainer's log-prob under the weights of the version that sampled it
    (pi_train,v, `reroll.trainer.snapshots`), None where it was not computed (prompt and
    environment tokens, a version without a snapshot, and tokens of the trainer's current
    version, whose pi_train,v is the update's own pi_prox); the field is None when the trainer
    computed none for this sample (the default: train.old_snapshots = 0)."""

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not self.loss_mask and not self.logprobs and not self.versions:
            self.loss_mask = [False] * n
            self.logprobs = [0.0] * n
            self.versions = [-1] * n
            if self.prompt_len and not self.spans:
                self.spans = [Span(0, self.prompt_len, "prompt")]
        self.check()

    # ---- invariants ------------------------------------------------------------------
    def check(self) -> None:
        n = len(self.tokens)
        lens = {len(self.loss_mask), len(self.logprobs), len(self.versions)}
        if lens != {n}:
            raise ValueError(
                f"rollout {self.sample_id}: tokens/loss_mask/logprobs/versions lengths "
                f"{n}/{len(self.loss_mask)}/{len(self.logprobs)}/{len(self.versions)} differ"
            )
        if not 0 <= self.prompt_len <= n:
            raise ValueError(f"rollout {self.sample_id}: prompt_len {self.prompt_len} > {n}")
        if self.old_logprobs is not None and len(self.old_logprobs) != n:
            raise ValueError(f"rollout {self.sample_id}: {len(self.old_logprobs)} old_logprobs "
                             f"for {n} tokens")

    # ---- growing a rollout (engine side) ---------------------------------------------
    def append(self, token: int, logprob: float, version: int, source: Source = "sampled") -> None:
        """Append one token; extends the last span when source and version match."""
        t = len(self.tokens)
        self.tokens.append(token)
        sampled = source in POLICY_SOURCES  # a verified draft token is the policy's
        self.loss_mask.append(sampled)
        self.logprobs.append(float(logprob) if sampled else 0.0)
        self.versions.append(version if sampled else -1)
        last = self.spans[-1] if self.spans else None
        if last is not None and last.end == t and last.source == source and last.version == version:
            last.end = t + 1
        else:
            self.spans.append(Span(t, t + 1, source, version))

    # ---- views -----------------------------------------------------------------------
    @property
    def prompt_tokens(self) -> list[int]:
        return self.tokens[: self.prompt_len]

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def response_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def n_sampled(self) -> int:
        return sum(self.loss_mask)

    @property
    def finished(self) -> bool:
        return self.finish in FINISHED

    @property
    def sampled_versions(self) -> list[int]:
        return [v for v, m in zip(self.versions, self.loss_mask) if m]

    @property
    def min_version(self) -> int:
        vs = self.sampled_versions
        return min(vs) if vs else self.start_version

    @property
    def reused(self) -> bool:
        """True for a copy of an earlier sample trained again (replay, response reuse): its
        policy spans are ``replayed``. Such samples are not evidence about the current
        policy (statistics and reward metrics leave them out)."""
        return any(s.source == "replayed" for s in self.spans)

    @property
    def failed(self) -> bool:
        """True when scoring produced an error (errors are data, never a silent 0)."""
        return self.finish == "error" or any(not s.ok for s in self.scores)

    def score(self, name: str) -> Score | None:
        return next((s for s in self.scores if s.name == name), None)

    # ---- JSON --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        if d["old_logprobs"] is None:  # not computed: records stay as they were without it
            del d["old_logprobs"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Rollout:
        d = dict(d)
        sampling = dict(d.get("sampling", {}))
        if sampling.get("stop_rule") is not None:
            sampling["stop_rule"] = StopRule(**sampling["stop_rule"])
        if sampling.get("draft") is not None:
            sampling["draft"] = Draft(**sampling["draft"])
        if sampling.get("redraft") is not None:
            sampling["redraft"] = SuffixSource(**sampling["redraft"])
        if sampling.get("branch_rule") is not None:
            sampling["branch_rule"] = BranchRule(**sampling["branch_rule"])
        if sampling.get("prune") is not None:
            sampling["prune"] = PruneRule(**sampling["prune"])
        d["sampling"] = SamplingParams(**sampling)
        d["scores"] = [Score(**s) for s in d.get("scores", [])]
        d["spans"] = [Span(**s) for s in d.get("spans", [])]
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown Rollout fields {sorted(unknown)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, s: str) -> Rollout:
        return cls.from_dict(json.loads(s))


@dataclass
class Group:
    """The rollouts of one prompt occurrence. Advantages are computed per complete group and
    are not stored: they are a pure function of the group's rewards."""

    group_id: str
    example: Example
    target_size: int
    rollouts: list[Rollout] = field(default_factory=list)
    start_version: int = -1
    filter_reason: str | None = None  # set when a filter rejected the whole group
    max_size: int = 0
    """Most samples the group may grow to (adaptive allocation): admission reserves this
    many; 0 means ``target_size`` (a group that never grows)."""

    @property
    def reserved(self) -> int:
        """Samples admission counts for it while it runs."""
        return max(len(self.rollouts), self.target_size, self.max_size)

    @property
    def prompt_id(self) -> str:
        return self.example.prompt_id

    @property
    def complete(self) -> bool:
        return len(self.rollouts) == self.target_size and all(r.finished for r in self.rollouts)

    @property
    def scored(self) -> bool:
        return self.complete and all(r.reward is not None or r.failed for r in self.rollouts)

    @property
    def rewards(self) -> list[float | None]:
        return [r.reward for r in self.rollouts]

    @property
    def min_version(self) -> int:
        return min((r.min_version for r in self.rollouts), default=self.start_version)

    def generated(self) -> list[Rollout]:
        """The samples generated for this group by the run's current policy, which is what
        statistics and reward metrics describe: its members, with a reused answer
        (response reuse) replaced by the fresh sample it displaced (kept in its
        ``control["reuse"]["replaced"]``), and replayed copies left out."""
        out = []
        for r in self.rollouts:
            if not r.reused:
                out.append(r)
            elif "replaced" in r.control.get("reuse", {}):
                out.append(Rollout.from_dict(r.control["reuse"]["replaced"]))
        return out

    def to_dict(self) -> dict:
        return {
            "group_id": self.group_id,
            "example": self.example.to_dict(),
            "target_size": self.target_size,
            "rollouts": [r.to_dict() for r in self.rollouts],
            "start_version": self.start_version,
            "filter_reason": self.filter_reason,
            "max_size": self.max_size,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Group:
        return cls(
            group_id=d["group_id"],
            example=Example.from_dict(d["example"]),
            target_size=d["target_size"],
            rollouts=[Rollout.from_dict(r) for r in d["rollouts"]],
            start_version=d.get("start_version", -1),
            filter_reason=d.get("filter_reason"),
            max_size=d.get("max_size", 0),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, s: str) -> Group:
        return cls.from_dict(json.loads(s))


def new_group(example: Example, size: int, prompt_tokens: list[int], sampling: SamplingParams,
              version: int, max_size: int = 0) -> Group:
    """A group of ``size`` fresh rollouts that all start from ``prompt_tokens`` (and may grow
    to ``max_size`` with `grow_group`)."""
    g = Group(group_id=new_id(), example=example, target_size=0, start_version=version,
              max_size=max_size)
    grow_group(g, size, prompt_tokens, sampling, version)
    return g


def grow_group(g: Group, n: int, prompt_tokens: list[int], sampling: SamplingParams,
               version: int, group_round: int = 0) -> list[Rollout]:
    """Append ``n`` fresh rollouts of the group's prompt (indices continue), added in
    allocation round ``group_round``; returns them."""
    new = [
        Rollout(prompt_id=g.example.prompt_id, group_id=g.group_id, tokens=list(prompt_tokens),
                prompt_len=len(prompt_tokens), index_in_group=len(g.rollouts) + i,
                group_round=group_round,
                sampling=replace(sampling, stop_token_ids=list(sampling.stop_token_ids),
                                 stop_strings=list(sampling.stop_strings)),
                start_version=version)
        for i in range(n)
    ]
    g.rollouts += new
    g.target_size += n
    return new
