"""Rollouts: the asynchronous pipeline that turns the scheduler's decisions into work.

Owns the asyncio side of generation: for every group the `Scheduler` admits it runs the
configured workflow as a task (awaiting the engine, environments and verifiers), closes the
group with the scheduler when the workflow is done, admits more, and wakes whoever waits for
a batch. New weights go to the engine through `publish`; `snapshot` captures everything not
yet consumed for a checkpoint. Runs inside one event loop; knows nothing of threads, of the
trainer or of where the engine runs (`reroll.runtime` hosts it).
"""

from __future__ import annotations

import asyncio
from typing import Any

from reroll import timeline as tl
from reroll.control.scheduler import Scheduler
from reroll.errors import RewardError
from reroll.rollout import Group
from reroll.workflows.base import EpisodeContext, Workflow


class Rollouts:
    def __init__(self, scheduler: Scheduler, workflow: Workflow, ctx: EpisodeContext, *,
                 partial_rollouts: bool = True):
        self.scheduler, self.workflow, self.ctx = scheduler, workflow, ctx
        self.engine = ctx.engine
        self.partial_rollouts = partial_rollouts
        self.tasks: dict[str, asyncio.Task] = {}
        self._changed: asyncio.Event | None = None
        self._error: BaseException | None = None

    # ---- what the runtime calls ----------------------------------------------------------
    async def start(self, rerun: list[Group] = ()) -> None:
        """Run the workflows of restored groups, then admit new ones."""
        self._changed = asyncio.Event()
        for g in rerun:
            self._run(g)
        self._admit()

    async def next_batch(self, n_samples: int, trainer_version: int) -> list[Group]:
        """Wait for ready groups holding ``n_samples`` samples, handed out by deadline.

        With adaptive allocation groups reserve their largest size, so the samples of a
        version may run out a little short of ``n_samples``: when nothing is running and no
        group can start, the batch is what fits (at least one group). The controller's step
        boundary (statistics, prices) is here, once per batch, and so is the Replay stage's:
        replayed groups join the fresh ones after it (`reroll.replay.stage.Replay.mix`)."""
        out: list[Group] = []
        got = 0
        s = self.scheduler
        while True:
            self._check()
            part = s.take(n_samples - got, trainer_version)
            out += part
            got += sum(len(g.rollouts) for g in part)
            if got < n_samples:
                self._admit()
            stuck = got < n_samples and not s.running and not s.can_admit(self.engine.version)
            if stuck and not out:  # the ready groups are larger than the slots: take one
                if not s.ready:
                    raise RuntimeError(f"rollout pipeline stalled: nothing ready, running or "
                                       f"admissible at version {trainer_version}; counters "
                                       f"{s.counters()}")
                out += s.take(max(len(g.rollouts) for g in s.ready), trainer_version)
            if got >= n_samples or (stuck and out):
                out = s.batch_order(out)
                s.controller.end_step(out)
                if s.replay is not None:
                    out = s.replay.mix(out, trainer_version)
                tl.mark("batch handed out", version=trainer_version,
                        samples=sum(len(g.rollouts) for g in out))
                return out
            self._changed.clear()
            await self._changed.wait()

    async def publish(self, weights: Any, version: int) -> None:
        """New policy weights; with partial rollouts, in-flight sequences are interrupted
        and resumed under them (prefix, log-probs and versions kept). Then admit."""
        self._check()
        tl.mark("publish begins", version=version)
        await self.engine.update_weights(weights, version, interrupt=self.partial_rollouts)
        n = self._admit()
        tl.mark("publish done", version=version, admitted_groups=n)

    async def snapshot(self) -> tuple[list[Group], dict]:
        """Unconsumed groups (in-flight records brought up to date) and the counters and
        data cursor that go with them."""
        self._check()
        await self.engine.sync()
        s = self.scheduler
        return s.snapshot(), {"prompts": s.prompts.state(), "counters": s.counters(),
                              "control": s.controller.state(),
                              "replay": s.replay.state() if s.replay is not None else {}}

    def referenced_versions(self, trainer_version: int) -> set[int]:
        """The policy versions unconsumed groups may still hold tokens of
        (`Scheduler.referenced_versions`)."""
        self._check()
        return self.scheduler.referenced_versions(trainer_version)

    def stats(self) -> dict:
        s = self.scheduler
        return {"engine": self.engine.stats(),
                "counters": s.counters(), "score_errors": dict(s.score_errors),
                "control": s.controller.metrics(),
                "replay": s.replay.metrics() if s.replay is not None else {}}

    async def close(self) -> None:
        for t in self.tasks.values():
            t.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        await self.engine.close()

    # ---- internals ---------------------------------------------------------------------
    def _admit(self) -> int:
        """Start the groups the scheduler admits now; how many."""
        if self._error is not None:
            return 0
        groups = self.scheduler.admit(self.engine.version)
        for g in groups:
            self._run(g)
        return len(groups)

    def _run(self, g: Group) -> None:
        self.tasks[g.group_id] = asyncio.get_running_loop().create_task(self._episode(g))

    async def _episode(self, g: Group) -> None:
        try:
            await self.workflow(self.ctx, g)
            self.scheduler.close(g)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # surfaced to the trainer's side by the next call
            self._error = e
        finally:
            self.tasks.pop(g.group_id, None)
            self._changed.set()
        self._admit()

    def _check(self) -> None:
        if isinstance(self._error, RewardError):  # the reward's own message, unwrapped
            raise self._error
        if self._error is not None:
            raise RuntimeError(f"rollout generation failed: {self._error}") from self._error
