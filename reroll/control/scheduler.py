"""The rollout scheduler: admits groups under the staleness rule, drives an engine, sends
finished rollouts to scoring, assembles complete groups, filters them, and hands them out.

A stateful service with one entry point per unit of work (`tick`) so that any runtime can drive
it: the local runtime from a thread, the Ray runtime from an actor. It owns the counters that
make the pipeline auditable: groups started, accepted, consumed, and dropped with a reason.
It knows nothing of the trainer or of threads.
"""

from __future__ import annotations

import time
import warnings
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future

from reroll.control.prompts import PromptStream
from reroll.control.staleness import allowed_lag, can_take, capacity
from reroll.rollout import Group, Rollout, SamplingParams, new_group

GroupFilter = Callable[[Group], "str | None"]  # returns the reason to drop, or None to keep


def request_seed(run_seed: int, group_seq: int, index: int) -> int:
    """Sampling seed of one request: a function of the run seed, the group's admission number
    and the sample's index, so sampling does not depend on what else the engine is running."""
    return ((run_seed * 1_000_003 + group_seq) * 1_009 + index) % (2**63)


class Scheduler:
    def __init__(self, engine, scorer, prompts: PromptStream, encode: Callable[[str], list[int]],
                 sampling: SamplingParams, *, group_size: int, batch_groups: int,
                 max_staleness: int = 0, overprovision: float = 1.0, partial_rollouts: bool = True,
                 filters: list[GroupFilter] = (), seed: int = 0,
                 shape_reward: Callable[[Rollout], float] | None = None,
                 max_score_retries: int = 3):
        self.engine, self.scorer, self.prompts, self.encode = engine, scorer, prompts, encode
        self.sampling, self.group_size, self.batch_groups = sampling, group_size, batch_groups
        self.max_staleness, self.overprovision = max_staleness, overprovision
        self.partial_rollouts, self.filters, self.seed = partial_rollouts, list(filters), seed
        self.shape_reward, self.max_score_retries = shape_reward, max_score_retries
        self.running: dict[str, Group] = {}  # started, not yet complete and scored
        self.ready: list[Group] = []  # complete, scored, passed filters, not yet consumed
        self.pending_scores: dict[str, tuple[Rollout, Future]] = {}
        self.order: dict[str, int] = {}  # group_id -> admission sequence number
        self.n_started = self.n_accepted = self.n_consumed = 0
        self.dropped: Counter[str] = Counter()
        self.score_errors: Counter[str] = Counter()  # failed scores per verifier
        self.score_failures: Counter[str] = Counter()  # failed groups per prompt id
        self.abandoned: list[str] = []  # prompts given up after max_score_retries failures
        self.time = Counter()  # seconds spent per activity
        self._drop_run = 0  # groups dropped since the last accepted one
        self.max_drop_run = 50 * batch_groups  # then stop: the pipeline is not converging

    # ---- admission -------------------------------------------------------------------
    def version(self) -> int:
        return self.engine.version

    def free_capacity(self) -> int:
        return capacity(self.version(), max_staleness=self.max_staleness,
                        batch_groups=self.batch_groups, accepted=self.n_accepted,
                        running=len(self.running), overprovision=self.overprovision)

    def admit(self) -> int:
        n = self.free_capacity()
        for _ in range(n):
            ex = self.prompts.next()
            seq = self.n_started
            g = new_group(ex, self.group_size, self.encode(ex.prompt), self.sampling,
                          self.version())
            for r in g.rollouts:
                r.sampling.seed = request_seed(self.seed, seq, r.index_in_group)
                r.timings["enqueue"] = time.time()
            self.order[g.group_id] = seq
            self.running[g.group_id] = g
            self.n_started += 1
            self.engine.add(g.rollouts)
        return n

    # ---- one unit of work ------------------------------------------------------------
    def tick(self) -> bool:
        """Admit, run one engine step, collect scores. Returns False when there was nothing
        to do (the caller may then wait)."""
        self.admit()
        busy = False
        if self.engine.pending():
            t0 = time.perf_counter()
            finished = self.engine.step()
            self.time["generate"] += time.perf_counter() - t0
            for r in finished:
                self._submit_score(r)
            busy = True
        return self._collect_scores() or busy

    def _submit_score(self, r: Rollout) -> None:
        g = self._adopt(r)
        r.timings["score_submit"] = time.time()
        self.pending_scores[r.sample_id] = (r, self.scorer.submit(r, g.example))

    def _adopt(self, r: Rollout) -> Group:
        """Engines in other processes (Ray) return copies: the returned record is the truth."""
        g = self.running[r.group_id]
        g.rollouts = [r if x.sample_id == r.sample_id else x for x in g.rollouts]
        return g

    def _collect_scores(self) -> bool:
        done = [k for k, (_, f) in self.pending_scores.items() if f.done()]
        for k in done:
            r, fut = self.pending_scores.pop(k)
            r.scores = fut.result()
            r.timings["score_done"] = time.time()
            if r.failed:
                for s in r.scores:
                    if not s.ok:
                        self.score_errors[s.name] += 1
            else:
                r.reward = self.scorer.combine(r.scores)
                if self.shape_reward is not None:
                    r.reward += self.shape_reward(r)
            g = self.running[r.group_id]
            if g.complete and all(x.sample_id not in self.pending_scores for x in g.rollouts):
                self._close_group(g)
        return bool(done)

    def _close_group(self, g: Group) -> None:
        del self.running[g.group_id]
        reason = "scoring_error" if any(r.failed for r in g.rollouts) else None
        for f in self.filters if reason is None else ():
            reason = f(g)
            if reason:
                break
        if reason:
            g.filter_reason = reason
            self.dropped[reason] += 1
            self._drop_run += 1
            if self._drop_run > self.max_drop_run:
                raise RuntimeError(
                    f"{self._drop_run} groups in a row were dropped (last reason: {reason}); "
                    f"dropped so far: {dict(self.dropped)}. With dynamic sampling this means "
                    f"every group gets identical rewards: the task is too hard or too easy "
                    f"for the model, or the verifier is broken")
            self.order.pop(g.group_id, None)
            if reason == "scoring_error":
                self._retry_or_abandon(g)
            return
        self._drop_run = 0
        self.n_accepted += 1
        self.ready.append(g)

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
        err = next((s.error for r in g.rollouts for s in r.scores if not s.ok), None)
        warnings.warn(f"prompt {pid!r}: scoring failed {self.score_failures[pid]} times, "
                      f"giving up on it (last error: {err})", RuntimeWarning, stacklevel=2)

    # ---- hand-out and weight updates -------------------------------------------------
    def take(self, n: int, trainer_version: int) -> list[Group]:
        """Up to ``n`` ready groups for the update at ``trainer_version``, earliest deadline
        (start version + allowed lag) first, then by admission order.

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
        deadlines = [d for g in self.ready + list(self.running.values())
                     if (d := deadline(g)) >= trainer_version]
        out = []
        while self.ready and len(out) < n:
            g = self.ready[0]
            overdue = deadline(g) < trainer_version
            if not overdue and not can_take(deadline(g), deadlines=deadlines,
                                            slots_left=n - len(out),
                                            trainer_version=trainer_version,
                                            batch_groups=self.batch_groups):
                break  # the remaining slots belong to earlier-deadline groups still running
            self.ready.pop(0)
            self.order.pop(g.group_id, None)
            if overdue:
                self.dropped["stale"] += 1
                self.n_accepted -= 1  # frees its admission slot; its prompt is retried
                self.prompts.push_front(g.example)
                continue
            deadlines.remove(deadline(g))
            out.append(g)
        self.n_consumed += len(out)
        return out

    def update_weights(self, state_dict, version: int) -> None:
        """New policy weights; with partial rollouts, in-flight sequences are aborted and
        resumed under the new weights (their prefix, log-probs and versions kept)."""
        aborted = self.engine.abort() if self.partial_rollouts else []
        self.engine.update_weights(state_dict, version)
        if aborted:
            self.engine.add(aborted)  # the engine re-prefills prompt + prefix: a resume

    # ---- checkpointing -----------------------------------------------------------------
    def snapshot(self) -> list[Group]:
        """All groups not yet consumed (ready first, then running with their partial
        rollouts). Aborts in-flight requests to capture them, then resumes them."""
        aborted = self.engine.abort()
        for r in aborted:
            r.finish = "running"
            self._adopt(r)
        snap = [Group.from_dict(g.to_dict()) for g in self.ready + list(self.running.values())]
        if aborted:
            self.engine.add(aborted)
        return snap

    def restore(self, groups: list[Group], counters: dict) -> None:
        self.n_started, self.n_accepted = counters["started"], counters["accepted"]
        self.n_consumed = counters["consumed"]
        self.dropped.update(counters.get("dropped", {}))
        self.score_errors.update(counters.get("score_errors", {}))
        self.score_failures.update(counters.get("score_failures", {}))
        self.abandoned = list(counters.get("abandoned", []))
        for g in groups:
            self.order[g.group_id] = counters["order"][g.group_id]
            if g.scored and g.filter_reason is None and all(r.reward is not None for r in g.rollouts):
                self.ready.append(g)
                continue
            self.running[g.group_id] = g
            todo = []
            for r in g.rollouts:
                if r.finished:
                    r.scores, r.reward = [], None
                    self._submit_score(r)
                else:
                    r.finish = "running"
                    todo.append(r)
            if todo:
                self.engine.add(todo)

    def counters(self) -> dict:
        return {"started": self.n_started, "accepted": self.n_accepted,
                "consumed": self.n_consumed, "dropped": dict(self.dropped),
                "score_errors": dict(self.score_errors),
                "score_failures": dict(self.score_failures), "abandoned": list(self.abandoned),
                "order": {gid: self.order[gid] for gid in
                          [g.group_id for g in self.ready] + list(self.running)}}
