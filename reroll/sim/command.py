"""`reroll sim CONFIG [overrides] [sim.KEY=VALUE ...]`: simulate a run's schedule.

The run's config (checked as for training) gives batch, group size, max_new_tokens,
max_staleness, over-provisioning and partial rollouts; the hardware and cost model come from
``--settings FILE`` (TOML or JSON, `reroll.sim.settings.SimSettings`) and ``sim.KEY=VALUE``
overrides. ``--compare KEY=V1,V2,...`` simulates the run once per value of one config key
(e.g. runtime.max_staleness=0,1,2). Prints the results as JSON, writes them to ``--out``
(default sim.json) and a picture beside it (sim.png) unless ``--no-png``; with
``--timeline PATH`` also the simulated schedule as a timeline (`reroll.sim.timeline`), in
the spans a real run's ``log.timeline`` writes. The composition
lives here; the reroll CLI only adds the parser.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("sim", help="simulate a run's schedule on a cluster (throughput, idle "
                       "devices, staleness) under a cost model")
    p.add_argument("config", help="TOML config file ('-' for the defaults)")
    p.add_argument("overrides", nargs="*",
                   help="key.path=value config overrides; sim.KEY=VALUE sets a sim setting")
    p.add_argument("--settings", help="sim settings file (TOML or JSON)")
    p.add_argument("--compare", help="KEY=V1,V2,...: one simulation per value of a config key")
    p.add_argument("--out", default="sim.json", help="the JSON file (default sim.json)")
    p.add_argument("--no-png", action="store_true", help="skip the picture")
    p.add_argument("--timeline", metavar="PATH",
                   help="also write the simulated schedule as a Chrome trace-event file, in "
                   "the spans a run's log.timeline records (one per variant with --compare: "
                   "PATH's name gets the variant)")
    p.set_defaults(fn=cmd_sim)


def cmd_sim(args: argparse.Namespace) -> int:
    from reroll.config import ConfigError
    from reroll.config_checks import load_checked
    from reroll.sim.settings import SimRun, SimSettings
    from reroll.sim.simulate import simulate
    from reroll.sim.timeline import TracedSimulation

    sim = {o.split("=", 1)[0][4:]: o.split("=", 1)[1] for o in args.overrides
           if o.startswith("sim.")}
    rest = [o for o in args.overrides if not o.startswith("sim.")]
    settings = SimSettings.load(args.settings, sim)
    variants = [("run", [])]
    if args.compare:
        key, _, vals = args.compare.partition("=")
        if not vals:
            raise ConfigError(f"--compare {args.compare!r}: expected KEY=V1,V2,...")
        variants = [(f"{key.rsplit('.', 1)[-1]}={v}", [f"{key}={v}"]) for v in vals.split(",")]
    results = {}
    for label, extra in variants:
        run = SimRun.from_config(load_checked(args.config, rest + extra))
        if args.timeline:
            traced = TracedSimulation(run, settings)
            results[label] = traced.run_all()
            path = Path(args.timeline)
            if args.compare:
                path = path.with_name(f"{path.stem}.{label}{path.suffix}")
            print(f"timeline: {traced.write(path)}")
        else:
            results[label] = simulate(run, settings)
        results[label]["run"] = vars(run)
    out = Path(args.out)
    out.write_text(json.dumps({"settings": settings.to_dict(), "results": results}, indent=1))
    for label, r in results.items():
        print(json.dumps({"variant": label, **{k: _round(r[k]) for k in SUMMARY}}))
    if not args.no_png:
        from reroll.sim.plot import plot

        print(plot(results, out.with_suffix(".png")))
    return 0


SUMMARY = ("samples_per_s", "tokens_per_s", "time_per_step_s", "gen_idle", "train_idle",
           "staleness", "early_stops")


def _round(v):
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    return round(v, 4) if isinstance(v, float) else v
