"""Training-side sections of a run's config: the algorithm, control, replay, the RL
optimiser and the supervised warm start. One dataclass per TOML table, a docstring under
each field, the valid interval of a numeric field in its metadata (`reroll.config.ranges`).
Declares settings only: knows nothing of what reads them, of the registries, or of torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from reroll.config.ranges import ranged


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
    kl_coef: float = ranged(0.0, "[0, inf)")
    """KL penalty coefficient beta. 0 disables the reference model entirely."""
    kl_in_reward: bool = False
    """Fold the KL penalty into the reward instead of adding it to the loss."""
    correction: str = "tis_token"
    """Off-policy correction of pi_prox / mu (registry `reroll.algo.CORRECTIONS`)."""
    correction_args: dict[str, Any] = field(default_factory=dict)
    """Hyperparameters of the correction (truncation cap, mask bounds)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more."""
    overlong_buffer: int = ranged(0, "[0, inf)")
    """DAPO soft overlong punishment buffer L_cache in tokens (0 disables)."""
    overlong_penalty: float = ranged(1.0, "[0, inf)")
    """DAPO overlong penalty factor."""
    ess_lr: bool = False
    """VCPO's ESS-scaled learning rate: each mini-batch's optimiser step runs at lr x
    rule(min(1, rho / ess_base_ratio)), rho = ESS / B of the samples' sequence IS weights
    pi_prox / mu (1 on-policy, falling as stale samples' weights spread); the schedule's lr
    is untouched. Logged as vcpo/ess_ratio and vcpo/lr_scale. VCPO's other half, the
    off-policy optimal baseline, is algo.advantage = "opob"."""
    ess_rule: str = "sqrt"
    """ESS learning-rate rule (registry `reroll.methods.vcpo.LR_RULES`): sqrt (Adam-type
    optimisers) or linear."""
    ess_base_ratio: float = ranged(1.0, "(0, 1]")
    """ESS ratio at or above which the full learning rate is kept, in (0, 1]."""
    ess_is_cap: float = ranged(0.0, "[0, inf)")
    """Clip each sequence IS weight at this value before the ESS (0: unclipped, as VCPO)."""


@dataclass
class ControlConfig:
    allocator: str = "fixed"
    """Samples per prompt (registry `reroll.control.allocators.ALLOCATORS`): fixed
    (rollout.group_size each), ar3po_stages (stages until one is correct: AR3PO's allocator
    alone; the method is preset=ar3po), dars (more for prompts under 50%; the method as its
    authors run it is preset=dars), xrpo (while the confidence interval shrinks enough; the
    method's built parts are preset=xrpo), gdro (proportional to the Bernoulli std, mean
    rollout.group_size). Adaptive groups grow in rounds; a step then trains on up to
    rollout.batch_groups x rollout.group_size samples."""
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
    history: int = ranged(8, "[1, inf)")
    """Observations (groups) kept per prompt for recent success rates and posteriors."""
    duet_abort: bool = False
    """DUET's marker-gated abort: a sample stops `duet_grace` tokens
    after its answer marker; one with no marker after `duet_horizon` tokens is pruned with
    probability 1 - `duet_q` (kept in the record, trained with weight 0) or goes on to EOS
    with sample weight 1 / `duet_q`, so the gradient stays unbiased. single_turn only."""
    duet_marker: str = ""
    """DUET: the answer marker (e.g. "####", "\\boxed{", "Answer:"), matched as the token
    sequence the tokenizer gives it; "" uses the task's own (arith_mixed with
    task.args.marker)."""
    duet_grace: int = ranged(4, "[0, inf)")
    """DUET: tokens sampled after the marker before the sample stops (room for the answer)."""
    duet_horizon: int = ranged(0, "[0, inf)")
    """DUET: policy tokens by which a marker must appear, or the sample faces the abort draw
    (0: no abort, only the stop after the marker). Below rollout.max_new_tokens."""
    duet_q: float = ranged(0.05, "(0, 1]")
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
    dot_k: float = ranged(0.0, "[0, inf)")
    """DOT outlier truncation: in groups where every sample succeeded, samples longer than
    mean + dot_k x std of the group's lengths are shaped by `dot_rule` (0 disables; the
    paper's setting is 3)."""
    dot_quantile: float = ranged(0.0, "[0, 1)")
    """DOT: use this quantile of the group's lengths as the threshold instead (0: mean +
    dot_k x std). Either one enables DOT."""
    dot_penalty: float = ranged(1.0, "[0, inf)")
    """DOT, dot_rule "penalty": reward removed from an outlying sample (recorded as a "dot"
    shaping term)."""
    dot_rule: str = ranged("truncate", "{truncate, penalty}")
    """DOT: "truncate" (the paper's rule) cuts an outlier at the threshold for the loss and
    gives it reward 0 (cut before its answer); "penalty" (reroll's variant) keeps it whole
    and removes `dot_penalty` reward (`reroll.methods.dot`)."""
    icl_samples: int = ranged(0, "[0, inf)")
    """XRPO's in-context seeding (`reroll.methods.xrpo_seeding`): a group whose samples are
    all wrong when the allocator closes it gets this many more, whose prompt starts with
    `icl_exemplars` problems the run already solved (0 disables; preset=xrpo: 4).
    single_turn only."""
    icl_exemplars: int = ranged(2, "[1, inf)")
    """In-context seeding: solved problems put before a seeded prompt (the most recently
    solved other prompts)."""
    icl_store: int = ranged(256, "[1, inf)")
    """In-context seeding: solved prompts kept (each with its latest correct completion),
    the oldest solved forgotten first."""
    icl_train: str = ranged("seeded", "{seeded, unseeded}")
    """In-context seeding: train seeded samples under the seeded prompt (on-policy) or
    under the plain prompt ("unseeded": off-policy, weighted by algo.correction's
    pi_prox / mu, so correction "none" is refused)."""


@dataclass
class ReplayConfig:
    buffer_size: int = ranged(0, "[0, inf)")
    """Rollout replay (DOTS+RR): informative groups (rewards not all equal) kept for reuse,
    the latest per prompt, first in first out beyond this many. 0 disables. With it on, a
    step generates `fresh_fraction` of rollout.batch_groups and draws the rest from the
    buffer (fewer while it fills); replayed samples keep their behaviour log-probs, so the
    objective's correction (algo.correction) weighs them by pi_prox / mu."""
    fresh_fraction: float = ranged(0.5, "(0, 1]")
    """Rollout replay: share of each step's groups generated fresh (sigma; DOTS uses 0.5)."""
    max_age: int = ranged(0, "[0, inf)")
    """Rollout replay: evict groups whose oldest token is more than this many policy
    versions old (0: only capacity evicts). Old groups get tiny or huge IS weights."""
    reuse: bool = False
    """AR3PO response reuse: a group with no correct answer gets a past correct answer of
    its prompt in place of its last member (so it has reward variance)."""
    reuse_per_prompt: int = ranged(1, "[1, inf)")
    """Response reuse: correct answers banked per prompt (the latest is reused)."""
    reuse_max_age: int = ranged(0, "[0, inf)")
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
    lr: float = ranged(1e-4, "(0, inf)")
    """AdamW learning rate."""
    weight_decay: float = ranged(0.0, "[0, inf)")
    """AdamW weight decay."""
    warmup_steps: int = ranged(0, "[0, inf)")
    """Linear learning-rate warm-up over this many steps (Adam's first steps are large)."""
    schedule: str = "constant"
    """Learning-rate schedule after the warm-up, a name in the `SCHEDULES` registry
    (`reroll.trainer.schedules`): constant, or linear: decays to 0 at the last update (TRL's
    default; here the warm-up ramp multiplies the decay instead of preceding it)."""
    schedule_steps: int = ranged(0, "[0, inf)")
    """Updates a decaying schedule (such as linear) spans; 0: train.steps. A resume that changes train.steps must
    keep the run's (set this to its train.steps); `reroll replay` keeps it by itself."""
    grad_clip: float = ranged(1.0, "[0, inf)")
    """Global gradient-norm clip (0 disables)."""
    minibatches: int = ranged(1, "[1, inf)")
    """Optimiser updates per step (the batch is split; proximal log-probs fixed at the start)."""
    micro_batch: int = ranged(64, "[1, inf)")
    """Sequences per forward/backward pass, at most; does not change the gradient. Each
    micro-batch is padded to its own longest sequence."""
    micro_batch_tokens: int = ranged(0, "[0, inf)")
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
    logprob_chunk: int = ranged(0, "[0, inf)")
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
    prox_ema: float = ranged(0.0, "[0, 1)")
    """PPO-EWMA (Hilton et al. 2022): > 0 makes the proximal policy pi_prox an exponential
    moving average of the trainer's past weights, theta_prox <- prox_ema x theta_prox +
    (1 - prox_ema) x theta after every update (one extra copy of the weights in memory, one
    extra forward pass per update); its log-probs are then pi_prox in the clip and in the
    correction's pi_prox / mu. 0: pi_prox is the weights at the start of the update.
    Checkpointed (prox_ema.pt)."""
    old_snapshots: int = ranged(0, "[0, inf)")
    """Per-version old log-probs (Guan et al. 2026, "Missing Old Logits in Asynchronous
    Agentic RL"): > 0 keeps trainer-side weight snapshots of at most this many policy
    versions (the current one included; each a copy of the weights in the trainer's memory)
    and computes each stale token's pi_prox under the weights of the version that sampled
    it, so the correction sees only the engine/trainer mismatch and the clip only the
    staleness. A version's snapshot is held exactly while a group the loop still holds
    (ready or in flight), a sample the replay stage holds (replay.buffer_size's groups,
    replay.reuse's answers) or the batch being trained references it, and never below the
    admission bound (runtime.max_staleness, one more with runtime.overprovision > 1); this
    is a hard cap on top: at it the unreferenced ones are already gone and the oldest
    referenced go next (offpol/snapshots_evicted), their tokens falling back to the
    update's pi_prox, as a replayed sample's older than the bound do, counted in
    offpol/snapshot_fallback_frac.
    max_staleness + 1 (+ 1) never evicts. Held count and bytes: offpol/snapshots_held,
    offpol/snapshot_bytes. The values are recorded per token (Rollout.old_logprobs). 0:
    off. Checkpointed (version_snapshots.pt)."""
    seed: int = 0
    """Seed of sampling, data order and initialisation."""


@dataclass
class SFTConfig:
    steps: int = ranged(250, "[0, inf)")
    """Supervised warm-start steps on task demonstrations."""
    lr: float = ranged(1e-3, "(0, inf)")
    """Learning rate of the warm start."""
    batch_size: int = ranged(128, "[1, inf)")
    """Demonstrations per step."""
    schedule: str = "constant"
    """Learning-rate schedule after warm-up, from the `SCHEDULES` registry: constant, or
    linear (decay to 0 at `steps`)."""
    warmup_steps: int = ranged(20, "[0, inf)")
    """Linear learning-rate warm-up steps of the warm start."""
    micro_batch_tokens: int = ranged(0, "[0, inf)")
    """Padded positions forwarded at once (a token budget, as `train.micro_batch_tokens`). 0: each
    step's batch goes through the model in one pass, padded to its longest demo. > 0: the
    batch is split into micro-batches of at most this many positions, longest demos
    together, and their gradients accumulate: the same step up to float rounding, with
    far less padding where demo lengths vary (reasoning traces)."""


@dataclass
class LoraConfig:
    rank: int = ranged(0, "[0, inf)")
    """LoRA rank r (`reroll.lora`, through peft; `pip install 'reroll[lora]'`). 0: off, every
    weight trains. > 0: the base weights are frozen and each targeted linear map W learns a
    low-rank update B A (B: out x r, A: r x in), so the optimiser holds state for the
    adapter only; the engine holds W + (alpha / r) B A (the first publish sends every tensor,
    later ones the adapters alone, which the engine merges; a server gets merged weights),
    checkpoints hold the adapter, and `reroll export` writes the merged model. Applies to
    `reroll train` and `reroll sft`."""
    alpha: float = ranged(16.0, "(0, inf)")
    """LoRA's alpha: the update is scaled by alpha / rank."""
    dropout: float = ranged(0.0, "[0, 1)")
    """Dropout on the adapter's input. Active only where the model trains in train mode
    (`reroll sft`); RL trains in eval mode (no dropout), so it has no effect there."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Names (suffixes) of the linear modules that get an adapter, e.g. ["q_proj", "v_proj"];
    ["all-linear"]: every linear map but the output embedding."""
