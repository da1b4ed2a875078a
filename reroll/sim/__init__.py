"""`reroll sim`: a discrete-event simulation of a run's schedule (synchronous or asynchronous
with bounded staleness, partial rollouts, over-provisioning, N generation and M training
devices, weight-sync time, continuous batching) under a cost model fitted from measured runs.

The admission and hand-out rules are the real scheduler's (`reroll.control.scheduler`,
`reroll.control.staleness`), driven by the simulation as the rollout pipeline drives them.
Modules: settings (the cost model and the run's schedule knobs), lengths (response lengths),
gen_device (one continuous-batching device), simulate (the event loop), calibrate (fit the
cost model from a run's metrics; calibrate_timeline from its timeline), engine_probe (the
engine's own prefill, timed), plot (matplotlib, imported only there), command (the CLI).
Importing this package imports none of them, so `reroll --help` stays quick: import what
you need from its modules (`reroll.sim.simulate.simulate`, `reroll.sim.settings.SimRun`).
"""
