"""The discrete-event simulation of a run's schedule, driving the real rollout scheduler.

Groups are admitted, finished and handed to the trainer by `reroll.control.scheduler.
Scheduler` itself (its admission is `reroll.control.staleness.capacity`, its hand-out
`staleness.can_take`), exactly as `reroll.control.rollouts.Rollouts` drives it: admit when a
group finishes and after each weight update, take ready groups until a step's samples are
there. Time comes from the cost model: generation devices (`reroll.sim.gen_device`), a
training step of ``train_step_s + train_token_s * tokens / train_devices``, the loop's own
work after it (``loop_s``: the trainer waits, generation goes on, as in `reroll.loop.run`,
which records and logs while the rollout pipeline keeps generating), the driver's handling
of finished rows before they reach the scheduler (``handle_row_s``; the driver's work runs
one piece at a time, on the first device's processor with ``loop_on_gen``), and a weight update
that stops trainer and generation for ``sync_s`` (with partial rollouts ``update_s`` more and
``update_row_s`` more a request in the engine, which it aborts and adds back in the
engine's order).

Early stops are the real rules too, on the simulated lengths. DUET (``run.duet_horizon``):
the run's `reroll.methods.duet.MarkerGate` gives each sample its stop rule and keep draw
(from its sampling seed, `reroll.control.scheduler.request_seed`); the answer marker is
taken to end a response, so a sample longer than the horizon has not shown it there, and
one not kept stops at the horizon. ARRoL (``run.pruner``): the run's pruner sizes the groups
and hands out their `PruneRule`; the engine's `reroll.engine.quality.GroupGate` collects the
members as they reach the checkpoint or finish before it and decides the survivors. The
quality head's predictions are not simulated: the gate decides with its warm-up rule
(seeded draws, `random_survivors`), i.e. survivors as a head would pick them if its
predictions said nothing of length; members that finished before the checkpoint survive,
as in the engine. Adaptive group sizes (``run.allocator``): the run's allocator plans each
group and adds rounds through `Scheduler.grow`, as the workflows do, from simulated
successes (each prompt's success rate drawn from Beta(success_a, success_b)). Knows no
engine, model or thread.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter

from reroll.control.controller import Controller
from reroll.control.prompts import PromptStream
from reroll.control.scheduler import Scheduler, request_seed
from reroll.rollout import Example, Group, grow_group, new_group
from reroll.sampling_params import SamplingParams
from reroll.sim.gen_device import GenDevice, Row
from reroll.sim.lengths import Lengths
from reroll.sim.settings import SimRun, SimSettings


class Simulation:
    def __init__(self, run: SimRun, s: SimSettings):
        self.run, self.s = run, s
        self.rng = random.Random(s.seed)
        self.lengths = Lengths(s, run.max_new_tokens)
        self.devices = [GenDevice(s, run.slots) for _ in range(s.gen_devices)]
        prompts = PromptStream([Example(f"p{i}", "", "") for i in range(1024)], seed=s.seed)
        # DUET's gate and the pruner, as the run builds them (`reroll.control.wiring`); the
        # marker's id is never a simulated token, the simulation places it (module doc)
        gate = None
        if run.duet_horizon > 0:  # imported here: the methods' modules import torch
            from reroll.methods.duet import MarkerGate

            gate = MarkerGate([-1], grace=0, horizon=run.duet_horizon, q=run.duet_q)
        self.batch = run.batch

        def start(*a, **kw):  # the group starter the scheduler calls, with .extend
            return self._start_group(*a, **kw)

        start.extend = self._extend_group
        ctl = Controller(run.build_allocator(), gate=gate, pruner=run.build_pruner())
        if ctl.adaptive and ctl.pruner is not None:  # as a run's config check refuses it
            raise ValueError(f"sim: pruner {run.pruner!r} with the adaptive allocator "
                             f"{run.allocator!r}: a pruned group is generated at one size")
        self.sched = Scheduler(prompts, start, group_size=run.generated_size,
                               batch_groups=run.batch_groups, max_staleness=run.max_staleness,
                               overprovision=run.overprovision, controller=ctl)
        self.success: dict[str, float] = {}  # prompt -> its success rate
        self.draws = random.Random(f"{s.seed}:success")  # apart: lengths draw as before
        self.gates: dict = {}  # undecided pruned groups' `GroupGate`s
        self.stops: Counter[str] = Counter()  # samples stopped early, by rule
        self.events: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self.now = 0.0
        self.engine_version = self.trainer_version = 0
        self.horizon: float | None = None  # end of the running training step or update
        self.got: list[Group] = []  # the step being gathered
        self.waiting = True  # the trainer waits for a batch
        self.plans: dict[int, tuple | None] = {}  # device -> (device, chunk end, token)
        self.updating = False  # weights being published: no new chunk starts
        self.stop_s = 0.0  # the update under way stops trainer and devices this long
        self.driver: list[list] = []  # the driver's work in order: [kind, seconds, rows]
        self.driver_since = 0.0  # when the first piece's seconds were last brought up to date
        self.driver_end: tuple | None = None  # its valid "driven" event
        self.step_ends: list[float] = []
        self.lags: Counter[int] = Counter()
        self.per_step: list[dict] = []  # the schedule's counts of each step (`result`)
        self.train_s = 0.0
        self.samples = self.tokens = 0
        self.left: dict[str, int] = {}  # group -> members still generating
        self._touched: set[int] = set()  # devices given rows by the admission under way

    # ---- what the scheduler calls ----------------------------------------------------------
    def _start_group(self, ex, seq, version, size, max_size=0, max_new_tokens=None):
        g = new_group(ex, size, [0], SamplingParams(), version, max_size)
        self.left[g.group_id] = 0
        self._run_members(g, g.rollouts, seq)
        return g

    def _extend_group(self, g, n, seq, group_round, prompt=None, control=None):
        """The allocator's next round of ``g``: ``n`` more members, run like the first."""
        self._run_members(g, grow_group(g, n, [0], g.rollouts[0].sampling, -1, group_round),
                          seq)

    def _run_members(self, g, members, seq) -> None:
        """Seeds, the controller's per-sample rules, lengths; the members' rows go to the
        least loaded device."""
        pairs = self.lengths.group(self.rng, len(members))
        for r in members:
            r.sampling.seed = request_seed(self.s.seed, seq, r.index_in_group)
        self.sched.controller.prepare(members)  # DUET's rule and the pruner's, if any
        d = min(range(len(self.devices)), key=lambda i: self.devices[i].load)
        rows = []
        for r, (p, n) in zip(members, pairs):
            stop, prune = r.sampling.stop_rule, r.sampling.prune
            if stop is not None and 0 < stop.horizon < n and not stop.keep:
                n, r.control["sim_stop"] = stop.horizon, "duet"  # aborted at the horizon
            if prune is not None and g.group_id not in self.gates:
                # the engine's gate; imported here: its module holds the head (torch)
                from reroll.engine.quality import GroupGate

                self.gates[g.group_id] = GroupGate(prune)
            r.tokens, r.prompt_len = [0] * p, p
            r.control["sim_len"] = n
            check = prune.at if prune is not None and n > prune.at else 0
            rows.append(Row(key=(g, r), ctx=p, left=n, prefill=p, check=check,
                            group=g.group_id))
        self.left[g.group_id] += len(members)
        self.devices[d].add(rows)
        self._touched.add(d)

    # ---- the run -----------------------------------------------------------------------
    def run_all(self) -> dict:
        self._admit()
        self._take()
        while len(self.step_ends) < self.s.steps:
            if not self.events:
                raise RuntimeError(f"sim stalled at t={self.now:.3f}: "
                                   f"{self.sched.counters()}")
            t, _, kind, what = heapq.heappop(self.events)
            if kind == "gen" and self.plans.get(what[0]) != what:
                continue  # a chunk that was cut or replanned
            if kind == "driven" and what != self.driver_end:
                continue  # the driver's work's end moved
            self._driver_account(t)
            self.now = t
            if kind == "gen":
                self._chunk_done(what[0])
            elif kind == "trained":
                self._trained()
            elif kind == "driven":
                self._driven()
            elif kind == "synced":
                self._synced()
            self._driver_schedule()
        return self.result()

    def _push(self, t: float, kind: str, what: object = None) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, what))

    def _chunk_event(self, i: int, end: float | None) -> None:
        """Device ``i``'s chunk ends at ``end``: its one valid event (None: idle)."""
        self._seq += 1
        self.plans[i] = None if end is None else (i, end, self._seq)
        if end is not None:
            self._push(end, "gen", self.plans[i])

    def _plan(self, i: int) -> None:
        dev = self.devices[i]
        if dev.chunk is not None:
            return
        dev.t = max(dev.t, self.now)
        if self.horizon is not None and dev.t >= self.horizon - 1e-12:
            return  # a training step ends now: its weight update comes first
        self._chunk_event(i, dev.plan(self.horizon))

    def _admit(self) -> None:
        self.sched.admit(self.engine_version)
        for d in self._touched:  # new rows join after the decode step under way
            self._recut(d, self.now)
        self._touched.clear()
        if not self.updating:
            for i in range(len(self.devices)):
                self._plan(i)

    def _chunk_done(self, i: int) -> None:
        self.plans[i] = None
        dev = self.devices[i]
        done = dev.finish_chunk()
        for row in done:  # a member of an undecided pruned group that ends first survives
            g, r = row.key
            if g.group_id in self.gates:
                self.gates[g.group_id].arrive(r, 0.5, r.control["sim_len"],
                                              self.engine_version, finished=True)
        for row in dev.arrived:  # at the checkpoint (the prediction is not simulated)
            g, r = row.key
            self.gates[g.group_id].arrive(r, 0.5, r.sampling.prune.at, self.engine_version)
        for gid in [k for k, gate in self.gates.items() if gate.ready]:
            cut = self.gates.pop(gid).decide(False)
            done += dev.drop(lambda key, gid=gid, cut=cut: key[0].group_id == gid
                             and key[1].index_in_group in cut)
        if self.s.handle_row_s and done:  # the driver hands them on
            self._drive("handle", self.s.handle_row_s * len(done), done)
        else:
            for row in done:
                self._complete(row)
        self._admit()
        self._take()
        if self.updating and all(d.chunk is None for d in self.devices):
            self._push(self.now + self._stop(), "synced")

    def _complete(self, row: Row) -> None:
        """A member finished (or retired by a rule): its tokens, and its group if complete."""
        g, r = row.key
        n = row.ctx - r.prompt_len  # generated: its length, or where it was stopped
        r.tokens += [0] * n
        r.loss_mask = [False] * r.prompt_len + [True] * n
        r.finish, r.reward = "stop", float(self.draws.random() < self._success(r.prompt_id))
        if row.left > 0:
            r.finish = "pruned"
            self.stops["pruned"] += 1
        elif "sim_stop" in r.control:
            r.finish = "pruned"
            self.stops["duet_aborted"] += 1
        self.left[g.group_id] -= 1
        if self.left[g.group_id] == 0 and not (self.sched.controller.adaptive
                                               and self.sched.grow(g)):
            self.sched.close(g)  # complete: the allocator added no round

    def _success(self, prompt_id: str) -> float:
        """The prompt's success rate: Beta(success_a, success_b), seeded by the prompt."""
        if prompt_id not in self.success:
            rng = random.Random(f"{self.s.seed}:{prompt_id}")
            self.success[prompt_id] = rng.betavariate(self.s.success_a, self.s.success_b)
        return self.success[prompt_id]

    def _take(self) -> None:
        """Rollouts.next_batch's loop: take ready groups until the step's samples are in."""
        if not self.waiting:
            return
        n, s = self.batch, self.sched
        self.got += s.take(n - sum(len(g.rollouts) for g in self.got), self.trainer_version)
        got = sum(len(g.rollouts) for g in self.got)
        # adaptive groups reserve their largest size: the batch may be what fits
        stuck = got < n and not s.running and not s.can_admit(self.engine_version)
        if stuck and not self.got and s.ready:  # ready groups larger than the slots: one
            self.got += s.take(max(len(g.rollouts) for g in s.ready), self.trainer_version)
        if got < n and not (stuck and self.got):
            return
        batch, self.got, self.waiting = self.sched.batch_order(self.got), [], False
        self.sched.controller.end_step(batch)  # as Rollouts.next_batch: the allocator's step
        lags: Counter[int] = Counter()
        for g in batch:
            lags[self.trainer_version - g.start_version] += 1
        self.lags.update(lags)
        self.per_step.append({"samples": sum(len(g.rollouts) for g in batch),
                              "lags": dict(sorted(lags.items())), "resumed": 0,
                              "resumed_tokens": 0, "resumed_by_age": {}})
        tokens = sum(len(r.tokens) for g in batch for r in g.rollouts)
        dt = self.s.train_step_s + self.s.train_token_s * tokens / self.s.train_devices
        self.train_s += dt
        self.samples += sum(len(g.rollouts) for g in batch)
        self.tokens += sum(r.n_sampled for g in batch for r in g.rollouts)
        self.horizon = self.now + dt  # no chunk runs past the step's end
        for i in range(len(self.devices)):
            self._recut(i, self.horizon)
        self._push(self.horizon, "trained")

    def _recut(self, i: int, t: float) -> None:
        """Device ``i``'s chunk ends with the decode step under way at ``t``, if later."""
        plan = self.plans.get(i)
        if plan is not None and plan[1] > t:
            self._chunk_event(i, self.devices[i].cut(t))

    # ---- the driver's own work: the loop's after a step, the handling of finished rows ----
    def _trained(self) -> None:
        """The step is trained: the loop's own work (``loop_s``, ``loop_row_s`` a sample
        of the step, ``first_loop_s`` more after the first) comes before the update, after
        the driver's work queued before it (`_drive`); generation goes on meanwhile."""
        s = self.s
        work = s.loop_s + s.loop_row_s * self.per_step[-1]["samples"]
        if len(self.per_step) == 1:
            work += s.first_loop_s
        if work <= 0 and not self.driver:
            self._publish()
            return
        self._drive("loop", work)

    def _drive(self, kind: str, work: float, rows: list[Row] | None = None) -> None:
        """Queue the driver's work: the loop's (``kind`` "loop") or the handling of
        finished ``rows`` ("handle"). The driver does one piece at a time, in order (its
        threads take turns at one interpreter lock); with ``loop_on_gen`` it shares the
        first device's processor while it has work (the loop's gets ``loop_share`` of it,
        a handling ``handle_share``)."""
        self._driver_account(self.now)
        self.driver.append([kind, work, rows])
        if len(self.driver) == 1:
            self.driver_since = self.now
            self._driver_share()

    def _driver_share(self) -> None:
        """The first device's speed as the driver's present piece of work leaves it."""
        if self.s.loop_on_gen:
            self._share(1.0 / (1.0 - self._kind_share(self.driver[0][0])) if self.driver
                        else 1.0)

    def _kind_share(self, kind: str) -> float:
        return self.s.loop_share if kind == "loop" else self.s.handle_share

    def _share(self, share: float) -> None:
        """The first device's wall time per unit of work from now on: ``share`` = 1 /
        (1 - the driver's share) while the driver's work shares its processor, 1 on its
        own, the decode step under way included: its chunk's end moves."""
        end = self.devices[0].set_share(share, self.now)
        if end is not None:
            self._chunk_event(0, end)

    def _driver_rate(self, kind: str) -> float:
        """A piece of the driver's work done per second: its kind's share while it shares
        a busy processor."""
        busy = self.s.loop_on_gen and self.plans.get(0) is not None
        return self._kind_share(kind) if busy else 1.0

    def _driver_account(self, t: float) -> None:
        """The driver's work done up to ``t`` at the rate since the last event."""
        if self.driver:
            self.driver[0][1] -= (t - self.driver_since) * self._driver_rate(self.driver[0][0])
            self.driver_since = t

    def _driver_schedule(self) -> None:
        """When the driver's present piece of work ends at the present rate; while the
        loop's work is queued, when it ends is the update's time: the horizon no chunk
        runs past (a device stopped at an earlier horizon plans again)."""
        if not self.driver:
            return
        kinds = [k for k, _, _ in self.driver]
        for _ in range(2):  # a device that starts a chunk now changes the rate once
            end = self.now + max(0.0, self.driver[0][1]) / self._driver_rate(kinds[0])
            if "loop" in kinds:
                ahead = self.driver[:kinds.index("loop") + 1]
                self.horizon = self.now + sum(max(0.0, w) / self._driver_rate(k)
                                              for k, w, _ in ahead)
                for i in range(len(self.devices)):
                    self._recut(i, self.horizon)
                    if self.plans.get(i) is None and not self.updating:
                        self._plan(i)
        if self.driver_end is None or abs(self.driver_end[0] - end) > 1e-12:
            self._seq += 1
            self.driver_end = (end, self._seq)
            self._push(end, "driven", self.driver_end)

    def _driven(self) -> None:
        """The driver's present piece of work is done: the loop's (the update follows) or
        the handling of finished rows (they reach the scheduler)."""
        kind, _, rows = self.driver.pop(0)
        self.driver_end = None
        self.driver_since = self.now
        if not self.driver or self.driver[0][0] != kind:
            self._driver_share()
        if kind == "handle":
            for row in rows:
                self._complete(row)
            self._admit()
            self._take()
            return
        self.horizon = self.now
        for i in range(len(self.devices)):
            self._recut(i, self.now)
        self._publish()

    def _publish(self) -> None:
        """The step is trained and the loop's work after it done: the weights go out once
        every device has finished the decode step under way; trainer and devices then stop
        (`_stop`)."""
        self.trainer_version += 1
        self.step_ends.append(self.now)
        self.per_step[-1]["started"] = self.sched.counters()["started"]  # as the loop logs it
        self.updating = True
        if all(d.chunk is None for d in self.devices):
            self._push(self.now + self._stop(), "synced")

    def _stop(self) -> float:
        """``sync_s`` and ``stall_s``; with partial rollouts and requests in the engine,
        ``update_s`` more and ``update_row_s`` more a request."""
        n = sum(d.load for d in self.devices) if self.run.partial_rollouts else 0
        self.stop_s = (self.s.sync_s + self.s.stall_s + self.s.update_row_s * n
                       + (self.s.update_s if n else 0.0))
        return self.stop_s

    def _synced(self) -> None:
        self.engine_version = self.trainer_version
        self.updating, self.horizon, self.waiting = False, None, True
        before = sum(d.resumed for d in self.devices)
        v, last = self.engine_version, self.per_step[-1]
        for k, of in (("running", lambda d: d.rows), ("waiting", lambda d: d.queue)):
            ages = Counter(v - row.key[0].start_version  # in the devices now, by age
                           for d in self.devices for row in of(d))
            last.setdefault("in_engine", {})[k] = dict(sorted(ages.items()))
        if self.run.partial_rollouts:  # the rows interrupted now
            last["resumed_by_age"] = last["in_engine"]["running"]
        tokens = sum(d.resumed_tokens for d in self.devices)
        for dev in self.devices:
            dev.pause(self.now, reprefill=self.run.partial_rollouts, stop=self.stop_s)
        self.per_step[-1]["resumed"] = sum(d.resumed for d in self.devices) - before
        self.per_step[-1]["resumed_tokens"] = sum(d.resumed_tokens for d in self.devices) - tokens
        self._admit()
        self._take()

    # ---- the outcome -------------------------------------------------------------------
    def result(self) -> dict:
        """Throughput, idle fractions, staleness histogram and time per step."""
        total = self.step_ends[-1]
        steps = [b - a for a, b in zip([0.0] + self.step_ends, self.step_ends)]
        n = sum(self.lags.values())
        gen_busy = [d.busy_s / total for d in self.devices]
        return {
            "steps": len(self.step_ends),
            "time_s": total,
            "time_per_step_s": total / len(self.step_ends),
            "time_per_step_after_first_s": (sum(steps[1:]) / (len(steps) - 1)
                                            if len(steps) > 1 else steps[0]),
            "samples_per_s": self.samples / total,
            "tokens_per_s": self.tokens / total,
            "gen_idle": 1 - sum(gen_busy) / len(gen_busy),
            "gen_idle_per_device": [1 - b for b in gen_busy],
            "gen_sync_share": sum(d.sync_s for d in self.devices) / total / len(self.devices),
            "train_idle": 1 - self.train_s / total,
            "staleness": {str(k): self.lags[k] / n for k in sorted(self.lags)},
            "step_ends_s": self.step_ends,
            "mean_response_tokens": self.tokens / self.samples,
            "counters": {k: v for k, v in self.sched.counters().items() if k != "order"},
            "batch": self.batch,
            "resumed": sum(d.resumed for d in self.devices),
            "early_stops": dict(self.stops),
            "per_step": self.per_step,
        }


def simulate(run: SimRun, settings: SimSettings) -> dict:
    """Simulate ``settings.steps`` training steps of ``run``; returns `Simulation.result`."""
    return Simulation(run, settings).run_all()
