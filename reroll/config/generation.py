"""Generation-side sections of a run's config: the model, the task, rollouts, the engine
and the reward (with its sandbox). One dataclass per TOML table, a docstring under each
field, the valid interval of a numeric field in its metadata (`reroll.config.ranges`).
Declares settings only: knows nothing of what reads them, of the registries, or of torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reroll.config.ranges import ranged


@dataclass
class ModelConfig:
    path: str = ""
    """Local checkpoint directory (transformers `save_pretrained` layout). Empty: build a
    tiny random-init model from the fields below (for CPU experiments and tests)."""
    arch: str = "qwen2"
    """Tiny-model architecture when `path` is empty: qwen2 or llama."""
    hidden_size: int = ranged(128, "[1, inf)")
    """Tiny model width."""
    num_layers: int = ranged(2, "[1, inf)")
    """Tiny model depth."""
    num_heads: int = ranged(4, "[1, inf)")
    """Attention heads of the tiny model."""
    num_kv_heads: int = ranged(2, "[1, inf)")
    """Key/value heads of the tiny model (grouped-query attention when < num_heads)."""
    intermediate_size: int = ranged(256, "[1, inf)")
    """MLP width of the tiny model."""
    max_position: int = ranged(256, "[2, inf)")
    """Context length of the tiny model."""
    dtype: str = ranged("float32", choices=("float32", "bfloat16", "float16"))
    """Compute dtype: float32, bfloat16 or float16 (CUDA only). The trainer always keeps
    float32 master weights and AdamW state; bfloat16 runs its forward and backward under
    bf16 autocast, and the engine (and the reference model) hold weights in this dtype,
    published to the engine cast to it. float16 trains in float32 (fp16 autocast would need
    loss scaling) and only the engine and reference model use it."""
    device: str = "auto"
    """Where the trainer and the engine run: auto (cuda when torch sees a GPU, else cpu),
    cpu, cuda or cuda:N. Batches are collated on the CPU and copied there."""


@dataclass
class TaskConfig:
    name: str = "arithmetic"
    """Registered task (registry `reroll.tasks.TASKS`; `reroll list tasks` names them all):
    arithmetic, countdown, countdown_search (a written-out search: the reasoning job),
    longtail, arith_mixed, guess, jsonl, parquet."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task builder, checked against its signature with the config."""
    seed: int = 0
    """Seed of the task's generator and of its train/test split."""
    train_limit: int = ranged(0, "[0, inf)")
    """Train (RL and SFT) on the first N examples of the train split only; 0: all of it. The
    test split is the task's own either way. A small pool brings each prompt back every
    N / rollout.batch_groups steps, which methods that reuse a prompt's earlier responses
    (replay.draft, replay.reuse) need before they can act."""
    skip_long_prompts: bool = False
    """Drop (and count) examples whose prompt leaves the model no room to answer, instead of
    refusing the data when it loads."""
    chat: bool = False
    """Render prompts (and environment turns) with the tokenizer's chat template. Needs a
    tokenizer that has one; the tiny-model tokenizer ships a small template."""


@dataclass
class RolloutConfig:
    group_size: int = ranged(8, "[1, inf)")
    """Samples per prompt (G). Advantages are normalised within each group."""
    batch_groups: int = ranged(16, "[1, inf)")
    """Groups (prompts) consumed by one training step."""
    max_new_tokens: int = ranged(8, "[1, inf)")
    """Response length limit; a response reaching it finishes with `length`."""
    temperature: float = ranged(1.0, "[0, inf)")
    """Sampling temperature for training rollouts (1.0 keeps the policy's own distribution)."""
    top_p: float = ranged(1.0, "(0, 1]")
    """Nucleus sampling threshold (1.0 disables)."""
    top_k: int = ranged(0, "[0, inf)")
    """Top-k filter (0 disables)."""
    workflow: str = "single_turn"
    """Rollout workflow (registry `reroll.workflows.WORKFLOWS`): single_turn (n samples of a
    prompt, scored by the verifiers), multi_turn (policy turns interleaved with an
    environment's observations) or tree (the n samples grow as trees forking inside the
    engine and sharing their prefixes: `tree_branch_at`, `tree_width`, `tree_credit`)."""
    env: str = ""
    """Environment of the multi_turn workflow (registry `reroll.envs.ENVIRONMENTS`)."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment, checked against its signature with the config."""
    max_turns: int = ranged(4, "[1, inf)")
    """multi_turn: most policy turns per episode."""
    max_episode_tokens: int = ranged(0, "[0, inf)")
    """multi_turn: most policy-sampled tokens per episode, over all turns (environment tokens
    do not count). 0: max_turns * max_new_tokens. `max_new_tokens` limits each turn."""
    tree_branch_at: list[int] = field(default_factory=list)
    """tree workflow: response positions (tokens sampled, ascending) where every branch of a
    sample tree forks into `tree_width` branches sharing the prefix (LATR-style tree
    rollouts); a group of n is n / tree_width^len(tree_branch_at) trees
    (a remainder makes a partial tree). How the trees are trained: `tree_credit`."""
    tree_width: int = 2
    """tree workflow: branches at each position of `tree_branch_at` (the branch that goes on
    plus tree_width - 1 forks); with tree_branch = "entropy", members per tree (a root and
    tree_width - 1 spares)."""
    tree_credit: str = "leaves"
    """tree workflow: how a tree group is trained. "leaves" (LATR): every leaf is an
    independent sample with the configured estimator's advantage, its inherited prefix
    tokens in the loss once per leaf that holds them. "segments" (TreeRL): each token is
    trained once, in the member that sampled it, with loss weight the number of leaves that
    hold it (the gradient of training every root-to-leaf path as its own sequence) and its
    node's advantage (V(s) - V(root)) + (V(s) - V(parent)), V = mean reward of the leaves below a
    node, V(root) = the group mean (`reroll.algo.tree_credit`). That formula replaces
    algo.advantage for tree groups (which is why it must stay at its default, and
    algo.advantage_args do not apply); a surrogate that trains one advantage per sequence
    (gspo; gspo_token is fine) and replay.reuse (a banked answer is not part of the tree)
    are refused. "segments_once": reroll's variant, the same with every token's weight 1.
    Sequence-level corrections then weigh each member's sampled tokens.
    Recorded per sample as control["tree"]["credit"]; derived from the record when the
    step trains, so resumes and `reroll replay` give the same advantages."""
    tree_credit_scale: bool = True
    """tree_credit = "segments" / "segments_once": divide a node's advantage by sqrt(leaves below it), TreeRL's
    reweighting, so that a prefix shared by many leaves does not dominate the update; false:
    the plain global + local advantage. Recorded as control["tree"]["scale"]."""
    tree_branch: str = "positions"
    """tree workflow: where branches fork. "positions": at `tree_branch_at`. "entropy"
    (LATR's rule): a group of n is ceil(n / tree_width) trees, each a
    root sampled from the prompt and tree_width - 1 spare members; wherever a member's two
    most likely tokens have p_j > tree_tau_abs and p_top - p_j < tree_tau_rel, the tree's
    next spare branches off there with the second token while the member takes the top one
    (`tree_parent`; span "forced": chosen, not sampled, yet trained like a sampled token);
    spares left unused are sampled independently. Cheaper than n samples only where the
    rule fires; the share of members it spawned is logged as tree/branched_share."""
    tree_tau_abs: float = ranged(0.15, "[0, 1)")
    """tree_branch = "entropy": branch only where the alternative token has at least this
    probability (LATR's tau_abs). Lower branches more often."""
    tree_tau_rel: float = ranged(0.25, "(0, 1]")
    """tree_branch = "entropy": branch only where the alternative token's probability is
    within this of the top token's (LATR's tau_rel). Higher branches more often."""
    tree_parent: str = ranged("argmax", "{argmax, sampled}")
    """tree_branch = "entropy": who takes which token where the rule fires. "argmax"
    (LATR's rule): the member takes the most likely token and the new branch the second
    (both span "forced": chosen, not sampled). "sampled" (reroll's variant): the member keeps
    the token it sampled and the branch takes the other of the two."""
    tree_mix_steps: int = ranged(0, "[0, inf)")
    """tree_branch = "entropy": LATR's decaying mix of tree and plain sampling. The share of
    a group's trees grown as trees falls linearly from 1 at policy version 0 to 0 at this
    version (after it every member is sampled independently); which trees are grown is a
    hash of the group and the tree, so a resumed run grows the same. 0: every tree is grown
    at every step."""
    tree_prune_at: list[int] = field(default_factory=lambda: [20, 30, 50])
    """tree_branch = "entropy": LATR's lookahead pruning. A branch is compared with the
    member it branched from over the first k tokens from its branch point, for each k here
    (the reference's rollout_filter_steps); where a test below says the two are alike it is
    pruned: it leaves the engine and becomes a spare of its tree again (counted as
    engine/branch_pruned). A window where either ends is skipped. []: no pruning."""
    tree_prune_edit: float = ranged(0.4, "[0, 1]")
    """tree_prune_at: prune when the windows' Levenshtein distance / k is below this (the
    reference's default 0.4). 0: this test off."""
    tree_prune_rouge_l: float = ranged(1.0, "[0, 1]")
    """tree_prune_at: prune when the windows' ROUGE-L F1 is above this (the reference's math
    runs: 0.5, with tree_prune_edit = 0). 1: this test off."""
    tree_prune_suffix: float = ranged(1.0, "[0, 1]")
    """tree_prune_at: prune when the longest suffix of one window found inside the other, over
    k, is above this (the reference's math runs: 0.2). 1: this test off."""

    @property
    def policy_token_limit(self) -> int:
        """Most policy-sampled tokens one sample may hold: the response limit of a
        single-turn sample, the episode limit of a multi-turn one (what length shaping
        measures against; environment tokens never count)."""
        if self.workflow in ("single_turn", "tree") and not self.env:
            return self.max_new_tokens
        return self.max_episode_tokens or self.max_turns * self.max_new_tokens


@dataclass
class EngineConfig:
    name: str = "torch"
    """Generation engine (registry `reroll.engine.ENGINES`): torch (continuous batching in
    this process, or in Ray actors with runtime.kind = ray), or openai (servers over HTTP:
    `reroll serve`, vLLM or SGLang; see base_url and server)."""
    max_batch: int = ranged(0, "[0, inf)")
    """KV-cache slots (sequences decoded together). 0: enough for the samples in flight."""
    device: str = ""
    """Where the torch engine's copy of the policy runs (auto, cpu, cuda, cuda:N); empty:
    model.device. On a machine with two GPUs, model.device = "cuda:0" and engine.device =
    "cuda:1" give generation and training a device each (with runtime.max_staleness >= 1
    they then overlap); new weights are copied across at each publish. The local runtime's
    in-loop held-out evaluation generates there too (`reroll eval` uses model.device). Ray
    engine actors take it too (with runtime.engine_gpus > 0: auto or cuda, among their own
    GPUs)."""
    base_url: str | list[str] = ""
    """engine.name = "openai": the server's URL (http://host:port), or a list of them:
    requests go to the one with the fewest in flight, and the requests of a server that
    dies are resumed on another."""
    server: str = "reroll"
    """What answers at base_url (registry `reroll.engine.SERVERS`): reroll (`reroll serve`),
    vllm (vLLM's OpenAI server, dev mode, --logprobs-mode processed_logprobs), sglang
    (SGLang's native API)."""
    api_key: str = ""
    """Bearer token for the servers; empty: $REROLL_API_KEY. Never written to the run's
    config.toml (recorded empty there: a run started again from that file reads the
    environment variable)."""
    timeout_s: float = ranged(600.0, "(0, inf)")
    """Longest wait for one response, and for a server to come back when all are down."""
    weights_dir: str = ""
    """Where new weights are written for servers that load them from disk (vllm: the model
    directory it was started from; sglang: a directory it can read). Empty: the tensors go
    in the request body (reroll serve)."""


@dataclass
class SandboxConfig:
    allow_unisolated: bool = False
    """Score `code` rewards even where the sandbox has neither namespaces (root) nor Landlock,
    so that policy-written programs could write outside their directory (warned)."""


@dataclass
class RewardConfig:
    verifiers: list[dict[str, Any]] = field(default_factory=list)
    """Reward components: a list of {name, weight, args}. Empty: the task's default verifier
    with weight 1. The scalar reward is the weighted sum; components stay visible."""
    workers: int = ranged(1, "[0, inf)")
    """Scoring worker processes (0 = score in a thread of the main process)."""
    inline: str = ranged("auto", choices=("auto", "always", "never"))
    """Score in the rollout loop itself, with no process or thread hand-off: "auto" when
    every reward component is a verifier registered as cheap (exact, numeric, countdown:
    pure, bounded, microseconds), "always" (trusted verifiers: no timeout, and a crash takes
    the run down), "never" (always the worker pool)."""
    timeout_s: float = ranged(10.0, "(0, inf)")
    """Per-call scoring timeout; a verifier that exceeds it yields an error score (its
    worker process is killed and replaced)."""
    max_errors: int = ranged(100, "[1, inf)")
    """Failed scores of one reward component in a row (raised, non-finite or wrongly typed
    result, timed out, killed its worker) after which the run stops with the last error. A
    failed score is never trained: its group is dropped and the prompt retried. A success
    resets the count, so an occasionally failing verifier never stops a run."""
    max_worker_crashes: int = ranged(10, "[0, inf)")
    """Scoring worker processes that may die (the reward killed its own process or
    crashed) and be replaced; one more and the run stops with the reason. Timeouts are
    not crashes: they count toward `max_errors`."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """How policy-written programs run (the `code` verifier)."""
