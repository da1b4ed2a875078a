"""Run configuration: dataclasses with a docstring per field, TOML load, ``a.b=c`` overrides
(the generic table <-> dataclass machinery is `reroll.tables`).

Owns the shape of a run's settings. Unknown keys are errors that name the key and the
closest valid one; values are converted to the field's type or rejected. The checks that
need the registries or look across fields (``reroll.config_checks.validate``) run when the
config loads, so a typo fails before any work starts. This module knows nothing of torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reroll.errors import CheckpointError, ConfigError  # noqa: F401  (re-exported)
from reroll.tables import (  # noqa: F401  (re-exported)
    apply_override,
    build,
    drop_none,
    merge,
    parse_value,
    read_toml,
    to_dict,
)

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class ModelConfig:
    path: str = ""
    """Local checkpoint directory (transformers `save_pretrained` layout). Empty: build a
    tiny random-init model from the fields below (for CPU experiments and tests)."""
    arch: str = "qwen2"
    """Tiny-model architecture when `path` is empty: qwen2 or llama."""
    hidden_size: int = 128
    """Tiny model width."""
    num_layers: int = 2
    """Tiny model depth."""
    num_heads: int = 4
    """Attention heads of the tiny model."""
    num_kv_heads: int = 2
    """Key/value heads of the tiny model (grouped-query attention when < num_heads)."""
    intermediate_size: int = 256
    """MLP width of the tiny model."""
    max_position: int = 256
    """Context length of the tiny model."""
    dtype: str = "float32"
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
    """Registered task: arithmetic, countdown, jsonl, parquet."""
    args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the task builder, checked against its signature at load."""
    seed: int = 0
    """Seed of the task's generator and of its train/test split."""
    skip_long_prompts: bool = False
    """Drop (and count) examples whose prompt leaves the model no room to answer, instead of
    refusing the data when it loads."""
    chat: bool = False
    """Render prompts (and environment turns) with the tokenizer's chat template. Needs a
    tokenizer that has one; the tiny-model tokenizer ships a small template."""


@dataclass
class RolloutConfig:
    group_size: int = 8
    """Samples per prompt (G). Advantages are normalised within each group."""
    batch_groups: int = 16
    """Groups (prompts) consumed by one training step."""
    max_new_tokens: int = 8
    """Response length limit; a response reaching it finishes with `length`."""
    temperature: float = 1.0
    """Sampling temperature for training rollouts (1.0 keeps the policy's own distribution)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1.0 disables)."""
    top_k: int = 0
    """Top-k filter (0 disables)."""
    workflow: str = "single_turn"
    """Rollout workflow (registry `reroll.workflows.WORKFLOWS`): single_turn (n samples of a
    prompt, scored by the verifiers), multi_turn (policy turns interleaved with an
    environment's observations) or tree (the n samples grow as trees forking inside the
    engine and sharing their prefixes: `tree_branch_at`, `tree_width`, `tree_credit`)."""
    env: str = ""
    """Environment of the multi_turn workflow (registry `reroll.envs.ENVIRONMENTS`)."""
    env_args: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment, checked against its signature at load."""
    max_turns: int = 4
    """multi_turn: most policy turns per episode."""
    max_episode_tokens: int = 0
    """multi_turn: most policy-sampled tokens per episode, over all turns (environment tokens
    do not count). 0: max_turns * max_new_tokens. `max_new_tokens` limits each turn."""
    tree_branch_at: list[int] = field(default_factory=list)
    """tree workflow: response positions (tokens sampled, ascending) where every branch of a
    sample tree forks into `tree_width` branches sharing the prefix (LATR-style tree
    rollouts, ALGORITHMS.md 3.12); a group of n is n / tree_width^len(tree_branch_at) trees
    (a remainder makes a partial tree). How the trees are trained: `tree_credit`."""
    tree_width: int = 2
    """tree workflow: branches at each position of `tree_branch_at` (the branch that goes on
    plus tree_width - 1 forks); with tree_branch = "entropy", members per tree (a root and
    tree_width - 1 spares)."""
    tree_credit: str = "leaves"
    """tree workflow: how a tree group is trained. "leaves" (LATR): every leaf is an
    independent sample with the configured estimator's advantage, its inherited prefix
    tokens in the loss once per leaf that holds them. "segments" (TreeRL, ALGORITHMS.md
    3.15): each token is trained once, in the member that sampled it, with its node's
    advantage (V(s) - V(root)) + (V(s) - V(parent)), V = mean reward of the leaves below a
    node, V(root) = the group mean (`reroll.algo.tree_credit`). That formula replaces
    algo.advantage for tree groups (which is why it must stay at its default, and
    algo.advantage_args do not apply); a surrogate that trains one advantage per sequence
    (gspo; gspo_token is fine) and replay.reuse (a banked answer is not part of the tree)
    are refused. Sequence-level corrections then weigh each member's sampled tokens.
    Recorded per sample as control["tree"]["credit"]; derived from the record when the
    step trains, so resumes and `reroll replay` give the same advantages."""
    tree_credit_scale: bool = True
    """tree_credit = "segments": divide a node's advantage by sqrt(leaves below it), TreeRL's
    reweighting, so that a prefix shared by many leaves does not dominate the update; false:
    the plain global + local advantage. Recorded as control["tree"]["scale"]."""
    tree_branch: str = "positions"
    """tree workflow: where branches fork. "positions": at `tree_branch_at`. "entropy"
    (LATR's rule, ALGORITHMS.md 3.12): a group of n is ceil(n / tree_width) trees, each a
    root sampled from the prompt and tree_width - 1 spare members; wherever a member's two
    most likely tokens have p_j > tree_tau_abs and p_top - p_j < tree_tau_rel, the tree's
    next spare branches off there with the token the member did not sample (span "forced":
    chosen, not sampled, yet trained like a sampled token); spares left unused are sampled
    independently. Cheaper than n samples only where the rule fires; the share of members
    it spawned is logged as tree/branched_share."""
    tree_tau_abs: float = 0.15
    """tree_branch = "entropy": branch only where the alternative token has at least this
    probability (LATR's tau_abs). Lower branches more often."""
    tree_tau_rel: float = 0.25
    """tree_branch = "entropy": branch only where the alternative token's probability is
    within this of the top token's (LATR's tau_rel). Higher branches more often."""

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
    max_batch: int = 0
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
    timeout_s: float = 600.0
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
    workers: int = 1
    """Scoring worker processes (0 = score in a thread of the main process)."""
    inline: str = "auto"
    """Score in the rollout loop itself, with no process or thread hand-off: "auto" when
    every reward component is a verifier registered as cheap (exact, numeric, countdown:
    pure, bounded, microseconds), "always" (trusted verifiers: no timeout, and a crash takes
    the run down), "never" (always the worker pool)."""
    timeout_s: float = 10.0
    """Per-call scoring timeout; a verifier that exceeds it yields an error score."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """How policy-written programs run (the `code` verifier)."""


@dataclass
class AlgoConfig:
    advantage: str = "grpo"
    """Advantage estimator (registry `reroll.algo.ADVANTAGES`)."""
    advantage_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the advantage estimator."""
    surrogate: str = "ppo_clip"
    """Per-token surrogate loss (registry `reroll.algo.SURROGATES`)."""
    surrogate_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the surrogate (clip bounds, dual clip, ...)."""
    aggregation: str = "token_mean"
    """How per-token losses reduce to a scalar (registry `reroll.algo.AGGREGATIONS`)."""
    aggregation_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the aggregation (e.g. the constant divisor of seq_mean_token_sum_norm)."""
    kl: str = "k3"
    """KL estimator against the reference policy (k1, k2, k3); used only when kl_coef > 0."""
    kl_coef: float = 0.0
    """KL penalty coefficient beta. 0 disables the reference model entirely."""
    kl_in_reward: bool = False
    """Fold the KL penalty into the reward instead of adding it to the loss."""
    correction: str = "tis_token"
    """Off-policy correction of pi_prox / mu (registry `reroll.algo.CORRECTIONS`)."""
    correction_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the correction (truncation cap, mask bounds)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment buffer L_cache in tokens (0 disables)."""
    overlong_penalty: float = 1.0
    """DAPO overlong penalty factor."""
    ess_lr: bool = False
    """VCPO's ESS-scaled learning rate: each mini-batch's optimiser step runs at lr x
    rule(min(1, rho / ess_base_ratio)), rho = ESS / B of the samples' sequence IS weights
    pi_prox / mu (1 on-policy, falling as stale samples' weights spread); the schedule's lr
    is untouched. Logged as vcpo/ess_ratio and vcpo/lr_scale. VCPO's other half, the
    off-policy optimal baseline, is algo.advantage = "opob"."""
    ess_rule: str = "sqrt"
    """ESS learning-rate rule (registry `reroll.algo.vcpo.LR_RULES`): sqrt (Adam-type
    optimisers) or linear."""
    ess_base_ratio: float = 1.0
    """ESS ratio at or above which the full learning rate is kept, in (0, 1]."""
    ess_is_cap: float = 0.0
    """Clip each sequence IS weight at this value before the ESS (0: unclipped, as VCPO)."""


@dataclass
class ControlConfig:
    allocator: str = "fixed"
    """Samples per prompt (registry `reroll.control.allocators.ALLOCATORS`): fixed
    (rollout.group_size each), ar3po (stages until one is correct), dars (more for prompts
    under 50%), xrpo (while the confidence interval shrinks enough), gdro (proportional to
    the Bernoulli std, mean rollout.group_size). Adaptive groups grow in rounds; a step then
    trains on up to rollout.batch_groups x rollout.group_size samples."""
    allocator_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the allocator."""
    selector: str = "uniform"
    """Which prompts are rolled out (registry `reroll.control.selectors.SELECTORS`): uniform
    (a seeded shuffle per epoch), dots (predicted success near 50%), vade (Thompson sampling
    of Beta posteriors), gdro (multiplicative weights over difficulty bins)."""
    selector_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the selector."""
    length: str = "fixed"
    """Response-limit schedule over policy versions (registry `reroll.control.lengths.
    LENGTHS`): fixed (rollout.max_new_tokens) or siri (cosine compress/expand)."""
    length_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the length schedule."""
    success_at: float = 1.0
    """A sample counts as a success for the per-prompt statistics when its verifier value
    (the reward components' combination, before length shaping) is at least this."""
    history: int = 8
    """Observations (groups) kept per prompt for recent success rates and posteriors."""
    duet_abort: bool = False
    """DUET's marker-gated abort (ALGORITHMS.md 3.4): a sample stops `duet_grace` tokens
    after its answer marker; one with no marker after `duet_horizon` tokens is pruned with
    probability 1 - `duet_q` (kept in the record, trained with weight 0) or goes on to EOS
    with sample weight 1 / `duet_q`, so the gradient stays unbiased. single_turn only."""
    duet_marker: str = ""
    """DUET: the answer marker (e.g. "####", "\\boxed{", "Answer:"), matched as the token
    sequence the tokenizer gives it; "" uses the task's own (arith_mixed with
    task.args.marker)."""
    duet_grace: int = 4
    """DUET: tokens sampled after the marker before the sample stops (room for the answer)."""
    duet_horizon: int = 0
    """DUET: policy tokens by which a marker must appear, or the sample faces the abort draw
    (0: no abort, only the stop after the marker). Below rollout.max_new_tokens."""
    duet_q: float = 0.05
    """DUET: keep probability of a sample past the horizon with no marker (weight 1 / q)."""
    pruner: str = "none"
    """Cut rollouts while they are generated (registry `reroll.control.pruners.PRUNERS`):
    arrol (ARRoL: ceil(overprovision x rollout.group_size) samples per group, cut to
    rollout.group_size inside the engine at a checkpoint position so that the survivors
    balance predicted successes and failures, from a quality head on the policy's hidden
    states trained online) or none. Pruned samples keep their record (finish "pruned") and
    are counted, out of the loss. Torch engine, local runtime, single_turn only."""
    pruner_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the pruner (arrol: at, overprovision, lr, warmup, hidden,
    updates; `reroll list pruners`)."""
    dot_k: float = 0.0
    """DOT outlier truncation: in groups where every sample succeeded, samples longer than
    mean + dot_k x std of the group's lengths lose `dot_penalty` reward (0 disables)."""
    dot_quantile: float = 0.0
    """DOT: use this quantile of the group's lengths as the threshold instead (0: mean +
    dot_k x std). Either one enables DOT."""
    dot_penalty: float = 1.0
    """DOT: reward removed from an outlying sample (recorded as a "dot" score)."""


@dataclass
class ReplayConfig:
    buffer_size: int = 0
    """Rollout replay (DOTS+RR): informative groups (rewards not all equal) kept for reuse,
    the latest per prompt, first in first out beyond this many. 0 disables. With it on, a
    step generates `fresh_fraction` of rollout.batch_groups and draws the rest from the
    buffer (fewer while it fills); replayed samples keep their behaviour log-probs, so the
    objective's correction (algo.correction) weighs them by pi_prox / mu."""
    fresh_fraction: float = 0.5
    """Rollout replay: share of each step's groups generated fresh (sigma; DOTS uses 0.5)."""
    max_age: int = 0
    """Rollout replay: evict groups whose oldest token is more than this many policy
    versions old (0: only capacity evicts). Old groups get tiny or huge IS weights."""
    reuse: bool = False
    """AR3PO response reuse: a group with no correct answer gets a past correct answer of
    its prompt in place of its last member (so it has reward variance)."""
    reuse_per_prompt: int = 1
    """Response reuse: correct answers banked per prompt (the latest is reused)."""
    reuse_max_age: int = 0
    """Response reuse: ignore banked answers sampled more than this many versions ago
    (0: no limit)."""
    draft: str = "none"
    """Speculative rollouts (registry `reroll.replay.drafts.DRAFTERS`): each fresh sample
    starts from a draft that the engine verifies under the current policy and samples on
    from its first rejected token. spec_rl (the prompt's response from last time, SPEC-RL;
    draft_args.lenience >= 1 keeps more of it, at a bias), das (the majority path through
    the prompt's recent responses, exact acceptance, and with draft_args.redraft = true,
    the default, re-drafting at every decode step from the suffix of the response so far),
    or none. engine.name = "torch" and the single_turn workflow only."""
    draft_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the drafter (spec_rl: lenience; das: history, min_count, redraft,
    max_match, draft_len, max_draft)."""


@dataclass
class TrainConfig:
    steps: int = 200
    """RL training steps (one optimiser update per step unless minibatches > 1)."""
    lr: float = 1e-4
    """AdamW learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up over this many steps (Adam's first steps are large)."""
    schedule: str = "constant"
    """Learning rate: constant after the warm-up, or linear: decays to 0 at the last update
    (TRL's default; here the warm-up ramp multiplies the decay instead of preceding it)."""
    schedule_steps: int = 0
    """Updates a linear decay spans; 0: train.steps. A resume that changes train.steps must
    keep the run's (set this to its train.steps); `reroll replay` keeps it by itself."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 disables)."""
    minibatches: int = 1
    """Optimiser updates per step (the batch is split; proximal log-probs fixed at the start)."""
    micro_batch: int = 64
    """Sequences per forward/backward pass, at most; does not change the gradient. Each
    micro-batch is padded to its own longest sequence."""
    micro_batch_tokens: int = 0
    """Token budget of a forward/backward pass (verl's dynamic batch size): > 0 sorts each
    mini-batch's samples by length and cuts them into micro-batches of at most this many
    padded positions (samples x the longest of them; a longer sample alone; under
    share_prompt, the positions of the packed layout where a pass packs) and at most
    micro_batch samples, so long-tail response lengths leave little padding and memory is
    bounded by tokens, not rows. 0: micro_batch samples at a time, in order. Does not change
    the gradient (up to float rounding); train/padding_share says what padding is left."""
    skip_zero_advantage: bool = True
    """Leave samples that cannot move the weights out of the loss's forward and backward
    passes: all advantages 0 (a group whose samples all scored the same, under GRPO) where
    the objective makes that loss 0 and gradient 0 (ppo_clip, gspo, gspo_token, reinforce
    with a row-local correction, no KL term in the loss, no ess_lr), or no trainable token.
    They still count in the loss's normalisers, so the update is the same up to float
    rounding. The per-token metrics of the update (train/entropy, clip fractions, ppo_kl,
    entropy_proxy, the correction's is/*) then describe the samples passed, and
    train/skipped_share says how many were not (excluded pivots included); a NaN in a
    skipped sample's log-probs is not seen. Mixture-of-experts models pass every sample
    (an expert reached only by skipped ones would get no optimiser step, not a zero one)."""
    share_prompt: bool = False
    """Forward the samples of a micro-batch that share a prompt (a GRPO group) as one packed
    row holding the prompt once, each response attending to it and to itself (4D mask,
    position ids restarting after the prompt): the same log-probs and gradients up to float
    rounding, with (k - 1) x prompt tokens fewer positions per group of k. The packed row's
    dense attention grows with its square, so a micro-batch is packed only where that costs
    fewer FLOPs than padding (long prompts next to responses; not a short prompt before long
    responses). A token budget (train.micro_batch_tokens) then sorts prompts, not samples,
    by length, so that a prompt's samples stay in one micro-batch where they fit, and counts
    the positions of the layout each pass runs in (packed rows x the widest; the mask of a
    packed pass, rows x width^2 booleans, is then larger than a padded pass's). Needs
    sdpa or eager attention and full-attention layers over rotary or learned positions
    (Llama, Qwen2/3, Mistral without a window, Gemma, ...): other models are refused."""
    logprob_chunk: int = 0
    """Tokens (rows of batch x positions) whose logits exist at once when log-probabilities
    are computed: the [batch, length, vocab] logits are made and dropped chunk by chunk (each
    chunk checkpointed, so the backward pass recomputes them one at a time too). 0: as many
    as keep one chunk at 2^27 logits (512 MiB in fp32; 883 tokens at a 151,936 vocabulary, a
    single chunk for the tiny models). Smaller saves memory, at a little speed."""
    gradient_checkpointing: bool = False
    """Activation checkpointing: keep only each decoder layer's input and recompute the
    layer in the backward pass (about a third more compute, far less activation memory)."""
    fused_optimizer: bool = True
    """AdamW's fused kernel (RL and reroll sft): one call updates every parameter, as
    transformers' default optimiser (adamw_torch_fused). false: torch's default
    implementation (a Python loop over the parameters on the CPU, foreach kernels on CUDA).
    The same update up to float rounding."""
    seed: int = 0
    """Seed of sampling, data order and initialisation."""


@dataclass
class SFTConfig:
    steps: int = 250
    """Supervised warm-start steps on task demonstrations."""
    lr: float = 1e-3
    """Learning rate of the warm start."""
    batch_size: int = 128
    """Demonstrations per step."""
    schedule: str = "constant"
    """Learning-rate schedule after warm-up: constant, or linear (decay to 0 at `steps`)."""
    warmup_steps: int = 20
    """Linear learning-rate warm-up steps of the warm start."""


@dataclass
class EvalConfig:
    n_examples: int = 500
    """Held-out examples used by `reroll eval` and by evaluation during training."""
    k: int = 8
    """pass@k: samples per prompt for the unbiased pass@k estimate (1 disables)."""
    temperature: float = 1.0
    """Temperature of the pass@k samples (greedy accuracy always uses temperature 0)."""
    every: int = 0
    """Evaluate greedy accuracy every this many RL steps during training (0: never; `reroll
    eval` evaluates any checkpoint afterwards)."""


@dataclass
class RuntimeConfig:
    kind: str = "local"
    """Where services run: local (one process) or ray."""
    max_staleness: int = 0
    """Bound on policy-version lag of trained tokens. 0 is synchronous RL."""
    partial_rollouts: bool = True
    """On a weight update, abort in-flight rollouts, keep their prefix and resume them."""
    overprovision: float = 1.0
    """Start this many times the groups a step needs; unfinished ones carry over (APRIL)."""
    engine_workers: int = 1
    """Engine replicas (Ray runtime)."""
    engine_gpus: float = 0.0
    """Ray runtime: GPUs each engine replica reserves (a fraction shares one, e.g. 0.5).
    > 0: Ray places the replica where that many are free and shows it only those
    (CUDA_VISIBLE_DEVICES), and its model goes on the first (engine.device, else
    model.device, auto or cuda, resolved inside the actor: the driver may have no GPU). A
    whole number above 1 takes whole GPUs; a fraction must fit beside the others on one GPU.
    0: no reservation; replicas go where CPUs are free, see every GPU of their node and take
    their device as the driver resolves it (one machine, all on one device)."""
    trainer_gpus: float = 0.0
    """Ray runtime: GPUs the trainer actor reserves, as runtime.engine_gpus for a replica
    (e.g. 1 with engine_gpus = 1: trainer and engine on separate GPUs). > 0: the driver's
    own copy of the policy for in-loop evaluation goes on its CPU (the GPUs are the
    actors'). A side that reserves nothing takes its device (model.device for the
    trainer, engine.device else model.device for the engines) as the driver resolves it."""
    scoring_workers: int = 0
    """Ray runtime: scoring actors, each running reward.workers verifier processes (on a
    cluster they may sit on other nodes). 0 scores in the driver's own process pool."""
    threads: int = 0
    """torch intra-op threads of each side (the trainer's thread, the engine's thread). 0:
    every core for each side in a synchronous run (max_staleness = 0: the sides take turns,
    so neither leaves a core idle), half of them each in an asynchronous one (both work at
    once; more would oversubscribe the cores)."""
    keep_freed_memory: bool = True
    """glibc: keep freed heap memory in the processes that run models (the run's own, Ray's
    trainer and engine actors) instead of handing it back to the OS and faulting it in
    again on the next step (`reroll.memory`); the resident size stays at its peak. Off:
    glibc's own adaptive thresholds."""
    deterministic: bool = False
    """torch's deterministic kernels in every process that runs a model (the run's own, Ray's
    trainer and engine actors), as TrainingArguments.full_determinism sets them: a fixed
    cuBLAS workspace, cuDNN deterministic and not benchmarking, use_deterministic_algorithms
    (ops without a deterministic CUDA kernel, e.g. the cumsum of top-p sampling, warn
    instead of failing). So that equal GPU runs (resume and uninterrupted, Ray and local)
    agree bit for bit; slower. CPU kernels are deterministic already."""


@dataclass
class LogConfig:
    wandb: bool = False
    """Also send every metrics row to Weights & Biases, beside metrics.jsonl and TensorBoard
    (`pip install reroll[wandb]`). One W&B run per run directory (its id kept in
    RUN/wandb_id), so `--resume` continues it."""
    wandb_project: str = "reroll"
    """W&B project of the run."""
    wandb_mode: str = "offline"
    """online (streams to the W&B server; needs `wandb login`), offline (writes RUN/wandb;
    upload later with `wandb sync`) or disabled."""


@dataclass
class RunConfig:
    out_dir: str = "runs/default"
    """Run directory: resolved config, metrics.jsonl, TensorBoard events, checkpoints."""
    init: str = ""
    """Checkpoint directory to start from (e.g. the output of `reroll sft`). Empty: model."""
    preset: str = ""
    """Algorithm preset from configs/presets (grpo, dapo, ...); the file's own keys win."""
    log_every: int = 10
    """Steps between rows of metrics.jsonl / TensorBoard (the progress bar updates every step)."""
    ckpt_every: int = 100
    """Steps between checkpoints (the last step is always saved)."""
    record_every: int = 1
    """Record the groups consumed by every this-many-th step in the rollout store
    (RUN/rollouts/, one Parquet file per step; 0: never). `reroll replay` needs every step
    (1); a step of 128 short samples takes about 20 KB."""
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    log: LogConfig = field(default_factory=LogConfig)


# ---- loading -------------------------------------------------------------------------


def preset_path(name: str) -> Path:
    for root in (REPO_ROOT / "configs" / "presets", Path.cwd() / "configs" / "presets"):
        if (root / f"{name}.toml").is_file():
            return root / f"{name}.toml"
    p = Path(name)
    if p.is_file():
        return p
    raise ConfigError(f"preset {name!r} not found in configs/presets")


def load_config(path: str | Path | None, overrides: list[str] = (), check: bool = True) -> RunConfig:
    data = read_toml(path) if path and str(path) != "-" else {}  # "-": defaults only
    for item in overrides:
        apply_override(data, item)
    if data.get("preset"):
        data = merge(read_toml(preset_path(str(data["preset"]))), data)
    cfg = build(RunConfig, data)
    if check:
        from reroll.config_checks import validate

        validate(cfg)
    return cfg


def dump_toml(cfg: RunConfig) -> str:
    import tomli_w

    return tomli_w.dumps(drop_none(to_dict(cfg)))
