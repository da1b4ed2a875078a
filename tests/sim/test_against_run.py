"""The simulator's schedule against a real run's: a tiny run (local runtime) and the
simulation of its config on its recorded lengths give the same per-step counts where the
schedule fixes them whatever the costs (samples a step, groups started by each step's end),
and lags within the bound both respect. Which groups are late, and how many requests an
update catches in flight, depend on the costs: benchmarks/sim_validate.py compares those."""

from __future__ import annotations

import pytest

from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train
from reroll.sim.settings import SimRun, SimSettings
from reroll.sim.simulate import simulate


def real_counts(run_dir) -> list[dict]:
    rows = [r for r in read_metrics(run_dir) if "pipeline/samples_in_batch" in r]
    lags: dict[int, dict[int, int]] = {}
    for step, g in read_rollouts(run_dir):
        h = lags.setdefault(step, {})
        h[step - 1 - g["start_version"]] = h.get(step - 1 - g["start_version"], 0) + 1
    return [{"samples": int(r["pipeline/samples_in_batch"]), "started": int(r["pipeline/started"]),
             "lags": dict(sorted(lags[i].items())),
             "resumed": int(r.get("engine/requests_resumed", 0))}
            for i, r in enumerate(rows, 1)]


@pytest.mark.parametrize("staleness", [0, 1])
def test_per_step_counts_agree_with_a_real_run(tmp_path, small_run, staleness):
    cfg = small_run(tmp_path / "run", "train.steps=4", "record_every=1", "ckpt_every=100",
                    "eval.every=0", f"runtime.max_staleness={staleness}")
    train(cfg, progress=False)
    real = real_counts(tmp_path / "run")
    sim = simulate(SimRun.from_config(cfg),
                   SimSettings(lengths=str(tmp_path / "run"), steps=4, prompt_tokens=1))
    per = sim["per_step"]
    assert [p["samples"] for p in per] == [r["samples"] for r in real] == [16] * 4
    # by the end of step k (before its update, at engine version k - 1) admission has let
    # (max_staleness + k) batches of 4 groups start, and starts them at once: in both
    assert [p["started"] for p in per] == [r["started"] for r in real] == [
        4 * (staleness + k) for k in range(1, 5)]
    for counts in (real, per):  # every group within the allowed lag, the first step fresh
        assert counts[0]["lags"] == {0: 4}
        assert all(0 <= lag <= staleness for c in counts for lag in c["lags"])
        assert all(sum(c["lags"].values()) == 4 for c in counts)
    if staleness == 0:  # synchronous: nothing is in flight at an update
        assert [p["resumed"] for p in per] == [0] * 4 and real[-1]["resumed"] == 0
        assert all(c["lags"] == {0: 4} for c in real + per)
