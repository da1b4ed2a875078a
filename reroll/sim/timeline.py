"""A simulated run's timeline, in the spans a real run records with ``log.timeline = true``
(`reroll.timeline`), so a measured and a simulated schedule open side by side in Perfetto
(``reroll sim --timeline PATH``) and are read by the same code.

The trainer's row: ``wait for batch`` (from the end of the weight update, or the start,
until the batch is taken), ``train``, ``loop work`` (what the loop does after a step before
it publishes: recording, logging, statistics; with ``handle_row_s``, after the
handling of finished rows queued before it) and ``publish`` (until the devices have the
new weights: the decode step under way, then the update's stop). Each generation device's
row: ``decode`` (one chunk: ``steps`` decode steps of ``running`` rows, ``finished`` of
them done at its end; the driver's adds before it, ``add_row_s``, inside it, where a run's
timeline has ``add`` spans of their own) and
``update weights`` (the stop). Times in simulated seconds from 0.
"""

from __future__ import annotations

from pathlib import Path

from reroll import timeline
from reroll.sim.simulate import Simulation

TRAINER = 0  # the trainer's row; device i is row i + 1


class TracedSimulation(Simulation):
    """`Simulation` that also keeps the spans of its schedule (`spans`, `write`)."""

    def __init__(self, run, s):
        super().__init__(run, s)
        self.spans: list[dict] = []
        self._since = {"wait": 0.0}

    def _span(self, row: int, name: str, t0: float, t1: float, **args) -> None:
        self.spans.append({"name": name, "ph": "X", "ts": t0 * 1e6, "dur": (t1 - t0) * 1e6,
                           "pid": 0, "tid": row, "args": args})

    def _take(self) -> None:
        was = self.waiting
        super()._take()
        if was and not self.waiting:
            step = len(self.step_ends) + 1
            self._span(TRAINER, "wait for batch", self._since["wait"], self.now, step=step)
            self._since["train"] = self.now

    def _trained(self) -> None:
        self._span(TRAINER, "train", self._since.pop("train"), self.now,
                   step=len(self.step_ends) + 1)
        self._since["loop"] = self.now
        super()._trained()

    def _publish(self) -> None:
        step = len(self.step_ends) + 1
        t0 = self._since.pop("loop")
        if self.now > t0:
            self._span(TRAINER, "loop work", t0, self.now, step=step)
        self._since["publish"] = self.now
        super()._publish()

    def _synced(self) -> None:
        step = len(self.step_ends)
        self._span(TRAINER, "publish", self._since.pop("publish"), self.now, step=step,
                   version=self.trainer_version)
        for i in range(len(self.devices)):
            self._span(i + 1, "update weights", self.now - self.stop_s, self.now,
                       version=self.trainer_version)
        self._since["wait"] = self.now
        super()._synced()

    def _chunk_done(self, i: int) -> None:
        dev = self.devices[i]
        t0, steps = dev.chunk
        running = len(dev.rows)
        finished = sum(1 for r in dev.rows if r.left <= steps)
        super()._chunk_done(i)
        self._span(i + 1, "decode", t0, self.now, steps=steps, running=running,
                   finished=finished)

    def threads(self) -> dict[int, str]:
        return {TRAINER: "trainer", **{i + 1: f"device {i}" for i in range(len(self.devices))}}

    def spans_read(self) -> list[dict]:
        """The spans as `reroll.timeline.read` returns a file's: thread names, seconds."""
        return timeline.parse([{"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                                "args": {"name": n}} for tid, n in self.threads().items()]
                              + self.spans)

    def write(self, path: str | Path) -> Path:
        """The spans as a Chrome trace-event file (`reroll.timeline.write`)."""
        return timeline.write(path, self.spans, self.threads(), pid=0, origin=0.0)
