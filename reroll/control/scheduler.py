"""The rollout scheduler's bookkeeping: which groups may start (admission under the staleness
rule, counted in samples), what happens to a finished group (filters, drops with a reason,
retries), and which ready groups the trainer gets (earliest deadline first).

A state machine with no engine, no scorer, no threads and no event loop: `reroll.control.
rollouts.Rollouts` runs a workflow for every group `admit` returns and calls `close` when it
is done. It owns the counters that make the pipeline auditable: samples and groups started,
accepted, consumed, and dropped with a reason.

A failing reward is reported once: the first failed score of each reward component is one
warning naming the component (its function) and the prompt, and the first abandoned
prompt another; later ones are counted, not repeated. A component whose scores fail
``max_errors`` times in a row stops the run with a `reroll.errors.RewardError`.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable

from reroll.control.controller import Controller
from reroll.control.prompts import PromptStream
from reroll.control.staleness import allowed_lag, can_take, capacity, referenced_versions
from reroll.errors import RewardError
from reroll.rollout import Example, Group

GroupFilter = Callable[[Group], "str | None"]  # returns the reason to drop, or None to keep
StartGroup = Callable[..., Group]
"""``(example, admission number, version, size=, max_size=, max_new_tokens=)`` -> a new
group; with ``.extend(group, n, admission number, round)`` when groups may grow (and
``prompt=``, ``control=``: the new samples' prompt text and `Rollout.control` entries, for
a seeded round)."""


def request_seed(run_seed: int, group_seq: int, index: int) -> int:
    """Sampling seed of one request: a function of the run seed, the group's admission number
    and the sample's index, so sampling does not depend on what else the engine is running."""
    return ((run_seed * 1_000_003 + group_seq) * 1_009 + index) % (2**63)


class Scheduler:
    def __init__(self, prompts: PromptStream, start_group: StartGroup, *, group_size: int,
                 batch_groups: int, max_staleness: int = 0, overprovision: float = 1.0,
                 filters: list[GroupFilter] = (), max_score_retries: int = 3,
                 controller: Controller | None = None, replay=None, max_errors: int = 100):
        self.prompts, self.start_group = prompts, start_group
        self.controller = controller or Controller()
        self.replay = replay  # a `reroll.replay.stage.Replay` (response reuse), or None
        self.group_size, self.batch_groups = group_size, batch_groups
        self.batch = batch_groups * group_size  # samples per training step
        self.max_staleness, self.overprovision = max_staleness, overprovision
        self.filters, self.max_score_retries = list(filters), max_score_retries
        self.running: dict[str, Group] = {}  # started, workflow not yet done
        self.ready: list[Group] = []  # done, scored, passed filters, not yet consumed
        self.order: dict[str, int] = {}  # group_id -> admission sequence number
        self.taken: dict[str, int] = {}  # the same, of groups taken since `batch_order`
        self.n_started = self.n_accepted = self.n_consumed = 0  # groups
        self.s_accepted = 0  # samples of accepted groups (consumed or ready)
        self.dropped: Counter[str] = Counter()
        self.score_errors: Counter[str] = Counter()  # failed scores per verifier
        self.score_failures: Counter[str] = Counter()  # consecutive failed groups per prompt
        self.abandoned: list[str] = []  # prompts given up after max_score_retries failures
        self._drop_run = 0  # groups dropped since the last accepted one
        self._last_error: str | None = None
        self.max_drop_run = 50 * batch_groups  # then stop: the pipeline is not converging
        self.max_errors = max_errors  # failed scores of one component in a row: then stop
        self._error_run: Counter[str] = Counter()  # the current run of failures, per component
        self._warned: set[str] = set()  # components (and "abandoned") already reported
        self._versions: dict[str, set[int]] = {}  # ready group_id -> its tokens' versions

    # ---- admission -------------------------------------------------------------------
    def free_capacity(self, version: int) -> int:
        """Samples that may start now (AReaL's rule, `staleness.capacity`)."""
        running = sum(g.reserved for g in self.running.values())
        return capacity(version, max_staleness=self.max_staleness, batch=self.batch,
                        accepted=self.s_accepted, running=running,
                        overprovision=self.overprovision)

    def admit(self, version: int) -> list[Group]:
        """Start as many groups as the staleness rule has room for, each reserving the most
        samples it may grow to; the caller runs them."""
        out = []
        reserve = self.controller.plan("", version, self.group_size)["max_size"]
        while self.free_capacity(version) >= reserve:
            ex = self._next_prompt()
            plan = self.controller.plan(ex.prompt_id, version, self.group_size)
            g = self.start_group(ex, self.n_started, version, **plan)
            self.order[g.group_id] = self.n_started
            self.running[g.group_id] = g
            self.n_started += 1
            out.append(g)
        return out

    def _next_prompt(self) -> Example:
        gone = set(self.abandoned)  # an abandoned prompt is never drawn again
        for _ in range(2 * len(gone) + 1):  # two epochs' shuffles can put them back to back
            ex = self.prompts.next()
            if ex.prompt_id not in gone:
                return ex
        raise RuntimeError(f"every prompt drawn was abandoned after scoring failures "
                           f"({len(self.abandoned)} abandoned); last error: {self._last_error}")

    def can_admit(self, version: int) -> bool:
        """Whether a new group would be admitted now."""
        return self.free_capacity(version) >= self.controller.plan("", version,
                                                                    self.group_size)["max_size"]

    # ---- a round of a workflow finished ----------------------------------------------
    def grow(self, g: Group) -> int:
        """Adaptive allocation: add the samples the controller asks for to the running
        group ``g`` (fresh rollouts of its prompt, or of the seeded prompt the controller
        writes for an all-wrong group, seeded by their index, tagged with the next round);
        returns how many (0: the group is complete)."""
        n, prompt, control = self.controller.next_round(g)
        if n > 0:
            rnd = 1 + max(r.group_round for r in g.rollouts)
            extra = {} if prompt is None else {"prompt": prompt, "control": control}
            self.start_group.extend(g, n, self.order[g.group_id], rnd, **extra)
        return n

    # ---- a workflow finished ---------------------------------------------------------
    def close(self, g: Group) -> None:
        """Count its errors, filter it, and make it ready, or drop it with a reason."""
        del self.running[g.group_id]
        errors = [s for r in g.rollouts for s in r.scores if not s.ok]
        for s in errors:
            self.score_errors[s.name] += 1
        self._watch_errors(g)
        failed = any(r.failed or r.reward is None for r in g.rollouts)
        reason = "scoring_error" if failed else None
        if not failed and self.replay is not None:
            self.replay.inject(g)  # a group with no correct answer may get a banked one
        if not failed:
            self.controller.finish(g)
        if failed:
            self._last_error = errors[0].error if errors else "a sample has no reward"
        for f in self.filters if reason is None else ():
            reason = f(g)
            if reason:
                break
        if reason:
            self._drop(g, reason)
            return
        self._drop_run = 0
        self.score_failures.pop(g.example.prompt_id, None)  # counts consecutive failures
        self.n_accepted += 1
        self.s_accepted += len(g.rollouts)
        self.ready.append(g)

    def _drop(self, g: Group, reason: str) -> None:
        g.filter_reason = reason
        self.dropped[reason] += 1
        if reason != "scoring_error":
            self.controller.dropped(g, self.order.get(g.group_id, 0))
        self._drop_run += 1
        self.order.pop(g.group_id, None)
        if reason == "scoring_error":
            self._retry_or_abandon(g)
        if self._drop_run > self.max_drop_run:
            last = f"; last scoring error: {self._last_error}" if self._last_error else ""
            raise RuntimeError(
                f"{self._drop_run} groups in a row were dropped (last reason: {reason}); "
                f"dropped so far: {dict(self.dropped)}{last}. " + _HINTS.get(reason, ""))

    def _retry_or_abandon(self, g: Group) -> None:
        """A group whose scoring failed is never trained as a silent 0: its prompt is retried,
        and given up (listed in `abandoned`, with the error) after `max_score_retries`."""
        pid = g.example.prompt_id
        self.score_failures[pid] += 1
        if self.score_failures[pid] <= self.max_score_retries:
            self.prompts.push_front(g.example)
            return
        self.dropped["scoring_abandoned"] += 1
        self.abandoned.append(pid)
        self.controller.abandon(pid)
        err = next((s.error for r in g.rollouts for s in r.scores if not s.ok),
                   "a sample has no reward")
        if "abandoned" in self._warned:
            return
        self._warned.add("abandoned")
        warnings.warn(f"prompt {pid!r}: scoring failed {self.score_failures[pid]} times, "
                      f"giving up on it (last error: {err}); later prompts given up are "
                      f"listed in the run's counters, not reported again",
                      RuntimeWarning, stacklevel=2)

    def _watch_errors(self, g: Group) -> None:
        """Report each component's first failure once; stop after ``max_errors`` in a row."""
        for r in g.rollouts:
            for s in r.scores:
                if s.ok:
                    self._error_run.pop(s.name, None)
                    continue
                if s.info.get("reason") == "not run":  # another component's failure
                    continue
                self._error_run[s.name] += 1
                where = f"prompt {g.example.prompt_id!r} ({g.example.prompt[:60]!r})"
                if self._error_run[s.name] >= self.max_errors:
                    raise RewardError(
                        f"reward component {s.name!r} failed {self._error_run[s.name]} times "
                        f"in a row (reward.max_errors={self.max_errors}); last, on {where}: "
                        f"{s.error}")
                if s.name not in self._warned:
                    self._warned.add(s.name)
                    warnings.warn(
                        f"scoring failed on {where}: {s.error}. A failed sample is never "
                        f"trained (its group is dropped and the prompt retried); further "
                        f"failures of {s.name!r} are counted in score_errors/{s.name}, not "
                        f"reported again; {self.max_errors} in a row stop the run "
                        f"(reward.max_errors)", RuntimeWarning, stacklevel=3)

    # ---- hand-out ----------------------------------------------------------------------
    def take(self, n: int, trainer_version: int) -> list[Group]:
        """Ready groups holding up to ``n`` samples for the update at ``trainer_version``,
        earliest deadline (start version + allowed lag) first, then by admission order.

        A ready group is handed out only if every group with an earlier deadline, including
        ones still being generated, keeps a slot (`staleness.can_take`). So the caller waits
        for a long group that younger short ones overtook, instead of training the young ones
        and later dropping the old one as stale (which would waste its generation and tilt
        training toward short prompts). A group already past its deadline (possible after
        resuming with a smaller ``max_staleness``) is dropped, counted as "stale", and its
        prompt retried."""
        lag = allowed_lag(max_staleness=self.max_staleness, overprovision=self.overprovision)

        def deadline(g: Group) -> int:
            return g.start_version + lag

        self.ready.sort(key=lambda g: (deadline(g), self.order[g.group_id]))
        live = [g for g in self.ready + list(self.running.values())
                if deadline(g) >= trainer_version]
        deadlines, sizes = [deadline(g) for g in live], [len(g.rollouts) for g in live]
        out, got = [], 0
        while self.ready and got < n:
            g = self.ready[0]
            overdue = deadline(g) < trainer_version
            if not overdue and not can_take(deadline(g), deadlines=deadlines, sizes=sizes,
                                            slots_left=n - got, trainer_version=trainer_version,
                                            batch=self.batch, size=len(g.rollouts)):
                break  # the remaining slots belong to earlier-deadline groups still running
            self.ready.pop(0)
            self.taken[g.group_id] = self.order.pop(g.group_id, 0)
            self.s_accepted -= len(g.rollouts) if overdue else 0
            if overdue:
                self.dropped["stale"] += 1
                self.n_accepted -= 1  # frees its admission slot; its prompt is retried
                self.prompts.push_front(g.example)
                continue
            i = next(k for k, x in enumerate(live) if x is g)
            del live[i], deadlines[i], sizes[i]
            out.append(g)
            got += len(g.rollouts)
        self.n_consumed += len(out)
        return out

    def batch_order(self, groups: list[Group]) -> list[Group]:
        """One step's groups (taken over several `take` calls, as they became ready) in
        admission order, so the trainer sees the same batch whatever finished first."""
        out = sorted(groups, key=lambda g: self.taken.get(g.group_id, 0))
        self.taken.clear()
        return out

    def referenced_versions(self, version: int) -> set[int]:
        """The versions the unconsumed groups (ready or running) may hold tokens of, at
        trainer ``version`` (`staleness.referenced_versions`): a running group from its
        start version on, a ready group its tokens' own (read once per group, then cached
        while it waits), and the replay stage's held samples their own (`Replay.
        held_versions`: trained again later; the trainer keeps none below the lag)."""
        cache = {g.group_id: self._versions.get(g.group_id) for g in self.ready}
        for g in self.ready:
            if cache[g.group_id] is None:
                cache[g.group_id] = {v for r in g.rollouts for v in r.sampled_versions}
        self._versions = cache
        held = self.replay.held_versions() if self.replay is not None else []
        return referenced_versions(list(cache.values()) + held,
                                   [g.start_version for g in self.running.values()], version)

    # ---- checkpointing -----------------------------------------------------------------
    def snapshot(self) -> list[Group]:
        """Copies of all groups not yet consumed: ready first, then running with their
        partial rollouts (the caller brings in-flight records up to date first)."""
        return [Group.from_dict(g.to_dict()) for g in self.ready + list(self.running.values())]

    def restore(self, groups: list[Group], counters: dict) -> list[Group]:
        """Counters and unconsumed groups of a checkpoint; returns the groups whose workflow
        must run again (partly generated or unscored), now counted as running."""
        self.n_started, self.n_accepted = counters["started"], counters["accepted"]
        self.n_consumed = counters["consumed"]
        self.s_accepted = counters.get("accepted_samples", self.n_accepted * self.group_size)
        self.dropped.update(counters.get("dropped", {}))
        self.score_errors.update(counters.get("score_errors", {}))
        self.score_failures.update(counters.get("score_failures", {}))
        self.abandoned = list(counters.get("abandoned", []))
        rerun = []
        for g in groups:
            self.order[g.group_id] = counters["order"][g.group_id]
            if g.scored and g.filter_reason is None and all(r.reward is not None
                                                            for r in g.rollouts):
                self.ready.append(g)
            else:
                self.running[g.group_id] = g
                rerun.append(g)
        return rerun

    def counters(self) -> dict:
        return {"started": self.n_started, "accepted": self.n_accepted,
                "accepted_samples": self.s_accepted,
                "consumed": self.n_consumed, "dropped": dict(self.dropped),
                "score_errors": dict(self.score_errors),
                "score_failures": dict(self.score_failures), "abandoned": list(self.abandoned),
                "order": {gid: self.order[gid] for gid in
                          [g.group_id for g in self.ready] + list(self.running)}}


_HINTS = {
    "zero_variance": "Dynamic sampling drops groups whose rewards are all equal: the task is "
                     "too hard or too easy for the model, or the reward does not vary.",
    "scoring_error": "Every group failed scoring: the verifier is broken or misconfigured "
                     "(see the last scoring error).",
}
