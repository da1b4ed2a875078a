"""Builds the Control stage of a run from its config: the allocator, the prompt selector, the
length schedule, DUET's marker gate, the pruner, XRPO's in-context seeding and the
`Controller` holding them with the per-prompt statistics, restored from a checkpoint's state when resuming. Looks things up in
the registries; no decisions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reroll.control.allocators import ALLOCATORS
from reroll.control.controller import Controller, ValueOf
from reroll.control.lengths import LENGTHS
from reroll.control.prompts import PromptStream
from reroll.control.pruners import PRUNERS, build_pruner, generated_group_size
from reroll.control.selectors import SELECTORS
from reroll.control.shapers import SHAPERS
from reroll.control.staleness import admission_limit
from reroll.control.stats import PromptStats
from reroll.errors import ConfigError
from reroll.replay.stage import fresh_groups

if TYPE_CHECKING:
    from reroll.config import RunConfig
    from reroll.rollout import Example


def check_control(cfg: RunConfig) -> None:
    """Registry names and hyperparameters of [control], then a trial build (cross-field
    rules such as n_max >= group_size fail now, not when the run starts)."""
    c = cfg.control
    ALLOCATORS.check_kwargs(c.allocator, c.allocator_args, "control.allocator_args")
    LENGTHS.check_kwargs(c.length, c.length_args, "control.length_args")
    SELECTORS.check_choice("control.selector", c.selector, c.selector_args, off="uniform")
    check_pruner(cfg)  # before the trial build: the pruner sets the groups' size
    try:
        allocator, _ = build_allocator(cfg), build_length(cfg)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check_duet(cfg)
    check_seeding(cfg)
    rt = cfg.runtime
    # samples generated per version
    batch = fresh_groups(cfg.rollout, cfg.replay) * generated_group_size(c, cfg.rollout)
    room = admission_limit(0, max_staleness=rt.max_staleness, batch=batch,
                           overprovision=rt.overprovision)
    biggest = allocator.max_size() + c.icl_samples  # a seeded round comes after the last
    if biggest > room:
        raise ConfigError(
            f"control.allocator {c.allocator!r} (with control.icl_samples = "
            f"{c.icl_samples}) may grow a group to {biggest} "
            f"samples, more than the {room} one policy version may start (rollout."
            f"batch_groups x group_size x (max_staleness + 1), the fresh share of it with "
            f"replay.buffer_size): no group could ever start; "
            f"lower its n_max / stages or raise rollout.batch_groups")


def check_pruner(cfg: RunConfig) -> None:
    """``control.pruner``: its hyperparameters, a trial build, and the combinations it
    cannot work with (its entry's ``check`` trait), refused when the config is checked,
    naming the keys."""
    c = cfg.control
    if not PRUNERS.check_choice("control.pruner", c.pruner, c.pruner_args, off="none"):
        return
    try:
        p = build_pruner(c, cfg.rollout)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    check = PRUNERS.trait(c.pruner, "check")
    if check is not None:
        check(cfg, p)


def check_duet(cfg: RunConfig) -> None:
    """DUET's marker gate: what it cannot do is refused when the config is checked. (A gate
    with no marker at all is found when the task is built: `build_rollout.answer_marker_ids`.)"""
    c, r = cfg.control, cfg.rollout
    if not c.duet_abort:
        if c.duet_horizon > 0 or c.duet_marker:
            raise ConfigError("control.duet_horizon / control.duet_marker are set but "
                              "control.duet_abort = false: set it to true to use the gate")
        return
    if r.workflow != "single_turn":
        raise ConfigError(f"control.duet_abort = true works with rollout.workflow = "
                          f"\"single_turn\" only (its positions count one response), got "
                          f"{r.workflow!r}")
    e = cfg.engine
    if e.name != "torch" and not (e.name == "openai" and e.server == "reroll"):
        raise ConfigError(f"control.duet_abort = true needs an engine that applies its stop "
                          f"rule: engine.name = \"torch\", or \"openai\" with engine.server = "
                          f"\"reroll\"; got {e.name!r} (server {getattr(e, 'server', '')!r})")
    if c.duet_horizon >= r.max_new_tokens:
        raise ConfigError(f"control.duet_horizon ({c.duet_horizon}) must be below rollout."
                          f"max_new_tokens ({r.max_new_tokens}): no sample would reach it; "
                          f"0 turns the abort off (the stop after the marker stays)")


def check_seeding(cfg: RunConfig) -> None:
    """XRPO's in-context seeding: what it cannot do is refused when the config is checked."""
    c = cfg.control
    if c.icl_samples == 0:
        return
    if cfg.rollout.workflow != "single_turn":
        raise ConfigError(f"control.icl_samples > 0 (in-context seeding) works with rollout."
                          f"workflow = \"single_turn\" only (a seeded prompt is one "
                          f"text), got {cfg.rollout.workflow!r}")
    if c.pruner != "none":
        raise ConfigError("control.icl_samples > 0 and control.pruner cannot be combined: "
                          "the pruner sizes groups before they run, a seeded round comes "
                          "after")
    if c.icl_train == "unseeded" and cfg.algo.correction == "none":
        raise ConfigError("control.icl_train = \"unseeded\" trains seeded samples under "
                          "the plain prompt, off-policy (pi_prox on the plain prompt, mu "
                          "under the seeded one): name a correction (algo.correction = "
                          "\"tis_token\" or \"is_token\"), not \"none\"")


def build_seeder(c):
    """XRPO's in-context seeding rule, or None when ``control.icl_samples`` is 0."""
    if c.icl_samples == 0:
        return None
    from reroll.methods.xrpo_seeding import ICLSeeder

    return ICLSeeder(samples=c.icl_samples, exemplars=c.icl_exemplars, capacity=c.icl_store,
                     train=c.icl_train)


def build_allocator(cfg: RunConfig):
    c = cfg.control
    return ALLOCATORS.get(c.allocator)(generated_group_size(c, cfg.rollout), **c.allocator_args)


def build_length(cfg: RunConfig):
    c = cfg.control
    return LENGTHS.get(c.length)(cfg.rollout.max_new_tokens, **c.length_args)


def build_control(cfg: RunConfig, examples: list[Example], value_of: ValueOf,
                  state: dict | None = None, marker: list[int] = ()
                  ) -> tuple[Controller, PromptStream]:
    """The controller and the prompt stream it selects from, with ``state`` (a checkpoint's
    ``prompts`` and ``control`` entries) restored; ``marker``: the token ids of DUET's answer
    marker (`build_rollout.answer_marker_ids`) when ``control.duet_abort`` is on."""
    saved = state or {}
    allocator = build_allocator(cfg)
    length = build_length(cfg) if cfg.control.length != "fixed" else None
    c = cfg.control
    shapers = ([SHAPERS.get("dot")(k=c.dot_k, quantile=c.dot_quantile, penalty=c.dot_penalty,
                                   rule=c.dot_rule)]
               if c.dot_k > 0 or c.dot_quantile > 0 else [])
    gate = None
    if c.duet_abort:
        from reroll.methods.duet import MarkerGate

        gate = MarkerGate(list(marker), grace=c.duet_grace, horizon=c.duet_horizon, q=c.duet_q)
    ctl = Controller(allocator, PromptStats(c.history), value_of=value_of,
                     success_at=c.success_at, length=length, shapers=shapers, gate=gate,
                     pruner=build_pruner(cfg.control, cfg.rollout), seeder=build_seeder(c))
    choose = None
    if cfg.control.selector != "uniform":
        ctl.selector = SELECTORS.get(cfg.control.selector)(
            examples, cfg.train.seed, fresh_groups(cfg.rollout, cfg.replay),
            **cfg.control.selector_args)
        choose = lambda draw: ctl.selector.pick(draw, ctl.stats)  # noqa: E731
    ctl.load_state(saved.get("control"))
    prompts = PromptStream(examples, cfg.train.seed, choose=choose, **saved.get("prompts", {}))
    return ctl, prompts
