"""The simulator's settings: the hardware and cost model (`SimSettings`), loadable from a small
TOML or JSON file, and the schedule knobs it takes from a run's config (`SimRun`).

Owns the meaning of every cost parameter and where its value comes from. Knows nothing of
events, engines or the scheduler.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from reroll.config import ConfigError
from reroll.tables import read_toml


@dataclass
class SimSettings:
    """Hardware and cost model of a simulated run. Times are seconds of one device.

    A generation device runs continuous batching: each decode step emits one token for every
    running row and takes ``decode_base_s + decode_row_s * rows + decode_ctx_s * (sum of the
    rows' context lengths)``; a row admitted (or resumed after a weight update with partial
    rollouts) first pays ``prefill_token_s`` per token of its prompt and prefix (a resumed one
    ``resume_row_s`` and ``resume_token_s`` per such token more, an admitted one ``row_s``
    more), added to the step that admits it; the driver's add of a request holds the
    device ``add_row_s`` before its next step, and its handling of a finished one
    (``handle_row_s``) comes before the trainer can take it. Training a batch takes
    ``train_step_s + train_token_s * tokens / train_devices`` (data parallel: tokens are
    prompt + response of every sample). After it the loop does its own work for ``loop_s +
    loop_row_s * samples`` (the trainer waits, generation goes on under the old weights); then
    publishing the weights stops the trainer and every generation device for ``sync_s +
    stall_s`` after the devices' current decode step; with partial rollouts and requests in
    the engine, ``update_s`` more and ``update_row_s`` more per request."""

    gen_devices: int = 1
    """Generation devices (engine replicas); a group runs on the least loaded one."""
    train_devices: int = 1
    """Training devices; the per-token training cost is divided among them."""
    max_rows: int = 0
    """Continuous-batching slots of one generation device (rows decoded together); 0: as
    the run's engine sizes them (`reroll.build.engine_slots`: engine.max_batch, else
    enough for the samples in flight)."""
    prefill_budget: int = 1024
    """Prompt and prefix tokens one decode step may prefill to place waiting rows (distinct
    sequences, packed: the engine's ``max_prefill_tokens``); 0: no limit. Rows left over
    wait for the next step: after an update that aborts 250 requests with 12-token prompts
    and prefixes, placing them takes three steps."""
    admit_batch: int = 0
    """Free slots the device waits for before placing rows (unless every waiting row fits);
    0: an eighth of its slots, as the engine's ``admit_batch`` by default."""
    decode_base_s: float = 2e-3
    """Fixed cost of one decode step (kernel launches, sampling, Python)."""
    decode_row_s: float = 2e-5
    """Cost of one decode step per running row."""
    decode_ctx_s: float = 0.0
    """Cost of one decode step per token of context summed over the rows (attention reads)."""
    prefill_token_s: float = 1e-5
    """Prefill cost per prompt (or resumed prefix) token."""
    row_s: float = 0.0
    """Fixed cost of each sample the device admits, whatever its length (submitting it,
    scheduling it, handing it to scoring, beside what ``add_row_s`` and ``handle_row_s``
    take of it), added to the step that admits it."""
    add_row_s: float = 0.0
    """The driver's add of a request it submits (a new group's member; not an update's
    re-add, which is ``update_row_s``): it holds the device before its next decode step,
    whether the request finds a slot then or waits (`reroll.engine.service.EngineService`
    adds the submitted requests in the engine's thread between steps)."""
    handle_row_s: float = 0.0
    """The driver's handling of a finished sample (scoring it, completing its group, the
    scheduler's bookkeeping) before the scheduler sees it finished and the trainer can
    take it: the driver's work, one piece at a time after the loop's work queued before
    it, and with ``loop_on_gen`` on the first device's processor, shared as the loop's
    work is. Where ``row_s`` (paid at admission) lets an asynchronous run overlap it with
    training, this puts it between a batch's last decode step and its take."""
    resume_row_s: float = 0.0
    """Fixed cost of interrupting and resuming one running row at a weight update with
    partial rollouts (aborting, requeueing, scheduling it again), beside its prefill."""
    update_row_s: float = 0.0
    """With partial rollouts, a weight update's stop of the trainer and every device per
    request in the engine (running or waiting): the driver re-adds every aborted request,
    a group at a time, before the engine steps again and before the trainer can take its
    batch (`reroll.engine.service.EngineService.update_weights`,
    `reroll.runtime.ray.RayEnginePool.add`); `reroll.sim.calibrate.readd_row_s` measures
    it from the resuming runs' timings."""
    update_s: float = 0.0
    """With partial rollouts, a weight update's fixed stop beside ``sync_s`` when requests
    are in the engine, whatever their number: the interrupt itself (the abort of everything in the engine, a
    call to it, and the hand-back of what it returns), which a synchronous run never makes.
    `reroll.sim.calibrate.fit_resume_wall` fits it with ``resume_row_s`` on resuming runs
    whose resumes a step differ."""
    resume_token_s: float = 0.0
    """Cost of a resumed row per token of its prompt and prefix, beside ``prefill_token_s``:
    a resumed row re-enters the engine with its own prefix, prefilled on its own (an
    admitted group's members share their prompt's prefill), and is handed back and forth
    whole. The calibration fits it (`reroll.sim.calibrate.fit_resume`), with
    ``prefill_token_s`` 0."""
    train_step_s: float = 0.0
    """Fixed cost of one optimiser step."""
    train_token_s: float = 1e-4
    """Training cost (forward, backward, optimiser share) per token on one device."""
    loop_s: float = 0.0
    """The loop's own work after each training step, before it publishes the weights
    (recording the batch, metrics, fetching the weights: `reroll.loop.run`): the trainer
    waits, generation goes on (the rollout pipeline runs in threads of its own)."""
    loop_row_s: float = 0.0
    """The loop's own work per sample of the step (recording its rollouts, their metrics),
    beside ``loop_s``."""
    stall_s: float = 0.0
    """Mean time a step loses to stalls, charged at every update as a stop of the trainer
    and every generation device (`reroll.sim.calibrate.fit` measures it on the steps it
    leaves out of the other terms). On the calibration box the driver was held up 0.25-0.4
    s about once in 17 steps, whatever the step's work: its full garbage collections (with
    ``runtime.gc_freeze`` off), in the rollout thread's admission right after the weights
    were swapped, when the process stops as a whole (no admission, no engine step, no next
    training call)."""
    first_loop_s: float = 0.0
    """The loop's work after the first step beyond ``loop_s``: a run's first recording
    and logging set themselves up (210-265 ms on every calibration run of the main job on
    the Xeon, against 15-35 ms after). It shifts how far generation runs ahead of
    training from the start, which an asynchronous run's first steps keep
    (`reroll.sim.calibrate_timeline.first_loop` reads it off synchronous runs' timelines)."""
    loop_on_gen: bool = False
    """The driver's work (the loop's own, ``loop_s``, and the handling of finished samples,
    ``handle_row_s``) runs on the first generation device's processor (the driver pinned
    beside engine 0: `runtime.pin_cores` on a CPU machine): while both have work, the
    loop's goes at ``loop_share`` of its speed (a handling at ``handle_share``) and the
    device at the rest."""
    loop_share: float = 0.5
    """With ``loop_on_gen``, the share of the shared processor the loop's work gets while the
    device decodes (the driver runs several threads beside the engine's one:
    `reroll.sim.calibrate_timeline.loop_share` reads it off the runs' timelines)."""
    handle_share: float = 0.5
    """With ``loop_on_gen``, the share of the shared processor the driver's handling of
    finished samples (``handle_row_s``) gets while the device decodes
    (`reroll.sim.calibrate_timeline.handle_share` reads it off asynchronous runs'
    timelines: the rollout thread, which waits on its event loop between pieces of work,
    gets far less of it than the loop's work)."""
    sync_s: float = 0.0
    """Weight publication: trainer and generation devices stop this long per update
    (`reroll.sim.calibrate.fit` takes it from the synchronous waits' fixed part)."""
    lengths: str = "fixed"
    """Response lengths: fixed (rollout.max_new_tokens), lognormal (a long tail: median
    ``length_median``, log-space spread ``length_sigma``, cut at max_new_tokens) or the path
    of a run directory whose recorded rollouts are resampled, a group at a time."""
    length_median: float = 0.0
    """Median response length of the lognormal (0: half of max_new_tokens)."""
    length_sigma: float = 1.0
    """Standard deviation of log(length) of the lognormal."""
    prompt_tokens: int = 8
    """Prompt length of every sample (a recorded run's own lengths when lengths names one)."""
    success_a: float = 1.0
    """Success of a sample, for the allocators (control.allocator) that size groups by it:
    each prompt's success rate is drawn from Beta(success_a, success_b) (its own seed), and
    each of its samples is correct with that probability."""
    success_b: float = 1.0
    """See success_a."""
    steps: int = 50
    """Training steps simulated."""
    seed: int = 0
    """Seed of the length draws."""

    @classmethod
    def load(cls, path: str | Path | None, overrides: dict | None = None) -> SimSettings:
        """From a TOML (keys at the top level or under ``[sim]``) or JSON file, then
        ``overrides``; unknown keys are refused, naming them."""
        d: dict = {}
        if path:
            p = Path(path)
            d = json.loads(p.read_text()) if p.suffix == ".json" else read_toml(p)
            d = d.get("sim", d)
        d.update(overrides or {})
        known = {f.name: f for f in fields(cls)}
        bad = sorted(set(d) - set(known))
        if bad:
            raise ConfigError(f"unknown sim settings {bad}; known: {sorted(known)}")
        s = cls(**{k: _as(type(getattr(cls(), k)), v) for k, v in d.items()})
        if (s.gen_devices < 1 or s.train_devices < 1 or s.max_rows < 0 or s.steps < 1
                or s.prefill_budget < 0 or s.admit_batch < 0 or s.first_loop_s < 0):
            raise ConfigError("sim: gen_devices, train_devices and steps must be >= 1, "
                              "max_rows, prefill_budget, admit_batch and first_loop_s >= 0")
        if s.success_a <= 0 or s.success_b <= 0:
            raise ConfigError(f"sim: success_a and success_b must be > 0, got "
                              f"{s.success_a}, {s.success_b}")
        return s

    def __post_init__(self) -> None:
        for name in ("loop_share", "handle_share"):
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"sim: {name} is the driver's share of a processor it "
                                  f"shares with a device, in (0, 1); got {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


def _as(kind: type, v):
    if kind is bool:
        return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")
    return kind(v)


@dataclass
class SimRun:
    """What the simulator takes from a run's config: the schedule, not the model."""

    batch_groups: int = 16
    group_size: int = 8
    max_new_tokens: int = 8
    max_staleness: int = 0
    overprovision: float = 1.0
    partial_rollouts: bool = True
    slots: int = 256  # the engine's KV slots, as `reroll.build.engine_slots` sizes them
    duet_horizon: int = 0  # DUET's abort horizon (control.duet_horizon; 0: no abort)
    duet_q: float = 1.0  # DUET's keep probability past the horizon (control.duet_q)
    pruner: str = "none"  # control.pruner (ARRoL: "arrol"), built as the run builds it
    pruner_args: dict = field(default_factory=dict)  # control.pruner_args
    allocator: str = "fixed"  # control.allocator (samples per prompt), as the run builds it
    allocator_args: dict = field(default_factory=dict)  # control.allocator_args

    @classmethod
    def from_config(cls, cfg) -> SimRun:
        """From a checked `reroll.config.RunConfig` (its rollout and runtime tables)."""
        from reroll.build import engine_slots

        c = cfg.control
        return cls(slots=engine_slots(cfg), batch_groups=cfg.rollout.batch_groups,
                   group_size=cfg.rollout.group_size,
                   max_new_tokens=cfg.rollout.max_new_tokens,
                   max_staleness=cfg.runtime.max_staleness,
                   overprovision=cfg.runtime.overprovision,
                   partial_rollouts=cfg.runtime.partial_rollouts,
                   duet_horizon=c.duet_horizon if c.duet_abort else 0, duet_q=c.duet_q,
                   pruner=c.pruner, pruner_args=dict(c.pruner_args),
                   allocator=c.allocator, allocator_args=dict(c.allocator_args))

    def build_allocator(self):
        """The run's allocator (`reroll.control.allocators.ALLOCATORS`), sized as the run
        sizes it (the pruner's generated members)."""
        from reroll.control.allocators import ALLOCATORS

        return ALLOCATORS.get(self.allocator)(self.generated_size, **self.allocator_args)

    def build_pruner(self):
        """The run's pruner (`reroll.control.pruners.PRUNERS`), or None."""
        if self.pruner == "none":
            return None
        from reroll.control.pruners import PRUNERS

        return PRUNERS.get(self.pruner)(self.group_size, self.max_new_tokens, **self.pruner_args)

    @property
    def generated_size(self) -> int:
        """Members generated per group: the pruner's size, else group_size."""
        p = self.build_pruner()
        return p.size if p is not None else self.group_size

    @property
    def batch(self) -> int:
        """Samples a step trains on (pruned members included, as the loop counts them)."""
        return self.batch_groups * self.generated_size
