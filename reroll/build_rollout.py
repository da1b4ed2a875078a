"""Rollout-side builders: turn a RunConfig into what the rollout pipeline runs with: the
codecs (prompt and observation encoding, decoding), sampling parameters, the scorer
(verifier pool or the environment's reward), the workflow's episode context, the group
starter (new groups with per-request seeds), DAPO's filter and length shaping, and
multi-turn SFT demonstrations. Looks things up in registries; holds no algorithm logic.
Models, engines, tasks and the trainer are built in `reroll.build`.

Length shaping counts policy-sampled tokens only (environment tokens never count).
"""

from __future__ import annotations

from reroll.config import RunConfig
from reroll.rollout import SamplingParams


def encode_prompt(tok, chat: bool = False):
    """Prompt text -> token ids: with ``chat``, rendered as a user message by the tokenizer's
    chat template (with the generation prompt); otherwise the text with the tokenizer's BOS
    when it defines one."""
    if chat and not getattr(tok, "chat_template", None):
        raise ValueError("task.chat = true needs a tokenizer with a chat template")

    def encode(text: str) -> list[int]:
        if chat:
            return tok.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                           add_generation_prompt=True, return_dict=False)
        ids = tok(text, add_special_tokens=False).input_ids
        if tok.bos_token_id is not None:
            ids = [tok.bos_token_id] + ids
        return ids

    return encode


def answer_marker_ids(cfg: RunConfig, tok, task) -> list[int]:
    """Token ids of DUET's answer marker (``control.duet_marker``, else the task's
    ``answer_marker``) as the tokenizer writes it inside a completion; [] with the gate
    off. A gate with no marker to look for is a ConfigError."""
    c = cfg.control
    if not c.duet_abort:
        return []
    text = c.duet_marker or task.answer_marker
    if not text:
        from reroll.errors import ConfigError

        raise ConfigError(f"control.duet_abort = true needs an answer marker: task "
                          f"{cfg.task.name!r} has none; set control.duet_marker (e.g. "
                          f"\"####\" or \"\\\\boxed{{\")")
    return list(tok(text, add_special_tokens=False).input_ids)


def encode_observation(tok, chat: bool = False):
    """Environment text -> token ids appended after a policy turn: the plain text, or with
    ``chat`` a tool message rendered by the chat template followed by the generation prompt
    (so the model's next turn starts where the template expects it)."""

    def encode(text: str) -> list[int]:
        if chat:
            text = tok.apply_chat_template([{"role": "tool", "content": text}], tokenize=False,
                                           add_generation_prompt=True)
        return tok(text, add_special_tokens=False).input_ids

    return encode


def decoder(tok):
    return lambda ids: tok.decode(ids, skip_special_tokens=True)


def sampling_params(cfg: RunConfig, tok) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_new_tokens=r.max_new_tokens, stop_token_ids=[tok.eos_token_id])


def uses_verifiers(cfg: RunConfig) -> bool:
    """Whether the workflow scores with `reward.verifiers` (else its environment rewards)."""
    from reroll.workflows import WORKFLOWS

    return getattr(WORKFLOWS.get(cfg.rollout.workflow), "uses_verifiers", True)


def build_scorer(cfg: RunConfig, task):
    """A pool of verifier processes in this process (the Ray runtime may build scoring
    actors instead), or the environment's reward for a workflow scored by its environment."""
    from reroll.verifiers import ScoringPool
    from reroll.workflows import EnvReward

    if not uses_verifiers(cfg):
        return EnvReward()
    return ScoringPool(cfg.reward.verifiers, task.verifier, workers=cfg.reward.workers,
                       timeout_s=cfg.reward.timeout_s, inline=score_inline(cfg, task),
                       max_worker_crashes=cfg.reward.max_worker_crashes)


def score_inline(cfg: RunConfig, task) -> bool:
    """Whether verifiers run in the rollout loop itself (``reward.inline``): "auto" when
    every component is registered ``cheap`` (microseconds each: a process round trip per
    rollout would cost far more than the verdict)."""
    from reroll.verifiers import VERIFIERS

    if cfg.reward.inline != "auto":
        return cfg.reward.inline == "always"
    specs = cfg.reward.verifiers or [task.verifier]
    return all(VERIFIERS.trait(s["name"], "cheap", False) for s in specs)


def check_sandbox(cfg: RunConfig, task) -> None:
    """A reward that runs policy-written programs needs an isolated sandbox (or the user's
    opt-in): checked, and the isolation level reported, before the run starts."""
    from reroll.verifiers import VERIFIERS

    specs = cfg.reward.verifiers or [task.verifier]
    if uses_verifiers(cfg) and any(getattr(VERIFIERS.get(s["name"]), "needs_sandbox", False)
                                   for s in specs):
        from reroll.verifiers.sandbox import require_isolation

        require_isolation(cfg.reward.sandbox.allow_unisolated)


def episode_context(cfg: RunConfig, tok, engine, scorer, shaping=None):
    """What a workflow awaits: the engine, the scorer, codecs, the environment and limits."""
    from reroll.workflows import EpisodeContext
    from reroll.workflows.tree_options import TreeOptions

    make_env = None
    if cfg.rollout.env:
        from reroll.envs import ENVIRONMENTS

        env_cls, env_args = ENVIRONMENTS.get(cfg.rollout.env), dict(cfg.rollout.env_args)
        make_env = lambda: env_cls(**env_args)  # noqa: E731
    r = cfg.rollout
    return EpisodeContext(engine=engine, scorer=scorer, decode=decoder(tok),
                          encode_observation=encode_observation(tok, cfg.task.chat),
                          shape_reward=shaping, make_env=make_env, max_turns=r.max_turns,
                          max_new_tokens=r.max_new_tokens, max_episode_tokens=r.max_episode_tokens,
                          tree=TreeOptions.from_config(r))


def demo_turns(cfg: RunConfig):
    """Multi-turn SFT demonstrations from the environment (``example -> [(role, text)]``,
    deterministic per example), or None for single-turn tasks (their ``Example.demo``)."""
    if not cfg.rollout.env:
        return None
    import random

    from reroll.envs import ENVIRONMENTS

    env = ENVIRONMENTS.get(cfg.rollout.env)(**cfg.rollout.env_args)
    if not hasattr(env, "demo"):
        raise ValueError(f"environment {cfg.rollout.env!r} gives no demonstrations for SFT")
    return lambda ex: env.demo(ex, random.Random(f"{cfg.train.seed}:{ex.prompt_id}"))


def group_starter(cfg: RunConfig, tok, prepare=None):
    """(example, admission number, version, size=, max_size=, max_new_tokens=) -> a new
    group with per-request seeds; ``.extend(group, n, admission number, round)`` grows one
    (seeds continue with the sample's index, so they depend on nothing else running), of
    the group's prompt or of ``prompt=`` (a text encoded here: XRPO's seeded prompt, whose
    samples get ``control=`` in their `Rollout.control`).
    ``prepare(rollouts)``, when given, sees every new sample once its seed is set (the
    controller's per-sample decisions)."""
    import copy
    from dataclasses import replace

    from reroll.control.scheduler import request_seed
    from reroll.rollout import grow_group, new_group

    encode, params = encode_prompt(tok, cfg.task.chat), sampling_params(cfg, tok)
    encoded: dict[str, list[int]] = {}  # prompts come back every epoch: tokenise each once

    def ids_of(ex) -> list[int]:
        ids = encoded.get(ex.prompt)
        if ids is None:
            ids = encoded[ex.prompt] = encode(ex.prompt)
        return ids

    def seed(rollouts, seq: int) -> None:
        for r in rollouts:
            r.sampling.seed = request_seed(cfg.train.seed, seq, r.index_in_group)
        if prepare is not None:
            prepare(rollouts)

    def start(ex, seq: int, version: int, size: int | None = None, max_size: int = 0,
              max_new_tokens: int | None = None):
        p = params if max_new_tokens is None else replace(params,
                                                            max_new_tokens=max_new_tokens)
        g = new_group(ex, size or cfg.rollout.group_size, ids_of(ex), p, version, max_size)
        seed(g.rollouts, seq)
        return g

    def extend(g, n: int, seq: int, group_round: int, prompt: str | None = None,
               control: dict | None = None):
        first = g.rollouts[0]
        ids = first.prompt_tokens if prompt is None else encode(prompt)
        new = grow_group(g, n, ids, first.sampling, -1, group_round)
        for r in new:  # a seeded round (XRPO): what was put in the prompt, per sample
            r.control.update(copy.deepcopy(control or {}))
        seed(new, seq)

    start.extend = extend
    return start


def build_filters(cfg: RunConfig, combine) -> list:
    """DAPO dynamic sampling: drop groups whose verifier reward (``combine(scores)``, the
    configured combination of the reward components, before any length shaping) is the
    same for every sample."""
    from reroll.control.filters import FILTERS

    if not cfg.algo.dynamic_sampling:
        return []
    zero_var = FILTERS.get("zero_variance")

    def reward_spread(g):
        return zero_var([[combine(r.scores) for r in g.rollouts]])[0]

    return [reward_spread]


def build_shaping(cfg: RunConfig):
    """DAPO's soft overlong punishment as a reward-shaping term, or None. Measured in
    policy-sampled tokens against the sample's limit (a multi-turn episode's limit covers
    all its turns; environment tokens never count)."""
    if cfg.algo.overlong_buffer <= 0:
        return None
    import torch

    from reroll.algo.shaping import overlong_penalty

    L, buf, k = cfg.rollout.policy_token_limit, cfg.algo.overlong_buffer, cfg.algo.overlong_penalty
    return lambda r: float(overlong_penalty(torch.tensor([float(r.n_sampled)]), max_len=L,
                                            buffer=buf, factor=k)[0])
