"""`reroll sim` end to end (config, sim settings file and overrides, JSON, picture), the
lengths from a recorded run, and the cost-model fit on synthetic metrics."""

from __future__ import annotations

import json

import pytest

from reroll.cli import main
from reroll.config import ConfigError
from reroll.rollout import Example, new_group
from reroll.sampling_params import SamplingParams
from reroll.sim.calibrate import fit
from reroll.sim.lengths import Lengths
from reroll.sim.settings import SimSettings


def test_reroll_sim_writes_json_and_png(tmp_path, capsys):
    settings = tmp_path / "hw.toml"
    settings.write_text("[sim]\ngen_devices = 2\nsteps = 4\nlengths = 'lognormal'\n")
    out = tmp_path / "s.json"
    rc = main(["sim", "-", "rollout.batch_groups=4", "rollout.group_size=2",
               "--settings", str(settings), "sim.train_devices=2",
               "--compare", "runtime.max_staleness=0,1", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["settings"]["gen_devices"] == 2 and data["settings"]["train_devices"] == 2
    assert set(data["results"]) == {"max_staleness=0", "max_staleness=1"}
    assert data["results"]["max_staleness=1"]["run"]["max_staleness"] == 1
    assert out.with_suffix(".png").is_file()
    assert "samples_per_s" in capsys.readouterr().out


def test_unknown_sim_setting_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="nope"):
        SimSettings.load(None, {"nope": 1})
    assert main(["sim", "-", "sim.nope=1", "--out", str(tmp_path / "x.json")]) == 2


def test_lengths_resampled_from_a_recorded_run(tmp_path):
    from reroll.recording.store import RolloutStore

    g = new_group(Example("p", "", ""), 2, [1, 2, 3], SamplingParams(), 0)
    for r, n in zip(g.rollouts, (4, 7)):
        r.tokens += [5] * n
        r.loss_mask += [True] * n
        r.logprobs += [-1.0] * n
        r.versions += [0] * n
        r.finish, r.reward = "stop", 1.0
    store = RolloutStore(tmp_path)
    store.append(1, [g])
    import random

    src = Lengths(SimSettings(lengths=str(tmp_path)), max_new_tokens=6)
    assert src.group(random.Random(0), 3) == [(3, 4), (3, 6), (3, 4)]  # cut at 6, cycled


def test_fit_recovers_a_known_cost_model(tmp_path):
    # two synchronous runs, batches of 8 and 32 samples, made with base 0.01 s/step and
    # 0.001 s/token, training 0.05 s + 0.0002 s/token at 7 prompt tokens, 0.003 s of loop
    for name, n in (("a", 8), ("b", 32)):
        d = tmp_path / name
        d.mkdir()
        rows, t = [], 0.0
        for step, (mean, mx) in enumerate([(4.0, 6), (5.0, 6), (3.0, 5), (4.5, 6)]):
            wait = 0.01 * mx + 0.001 * n * mean
            train = 0.05 + 0.0002 * n * (7 + mean)
            t += wait + train + 0.003
            rows.append({"step": step + 1, "time": t, "pipeline/samples_in_batch": n,
                         "length/mean": mean, "length/max": mx, "time/train_s": train,
                         "time/wait_for_rollouts_s": wait, "time/step_s": wait + train})
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    f = fit([tmp_path / "a", tmp_path / "b"], prompt_tokens=7, skip=0)
    assert f["decode_base_s"] == pytest.approx(0.01)
    assert f["decode_row_s"] == pytest.approx(0.001)
    assert f["train_token_s"] == pytest.approx(0.0002)
    assert f["train_step_s"] == pytest.approx(0.05)
    assert f["loop_s"] == pytest.approx(0.003)  # the loop's own time: the trainer waits
    assert f["sync_s"] == pytest.approx(0.0, abs=1e-12)  # no fixed cost an update here


def test_the_simulator_imports_neither_torch_nor_matplotlib():
    import subprocess
    import sys

    code = ("import sys, reroll.sim.simulate, reroll.sim.command, reroll.sim.calibrate; "
            "print('torch' in sys.modules, 'matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]


def test_reroll_sim_takes_the_early_stops_from_the_config(tmp_path, capsys):
    out = tmp_path / "s.json"
    rc = main(["sim", "-", "rollout.batch_groups=2", "rollout.group_size=2",
               "rollout.max_new_tokens=8", "control.duet_abort=true", "control.duet_horizon=2",
               "control.duet_q=0.000001", "sim.steps=2", "sim.lengths=fixed", "--out", str(out),
               "--no-png"])
    assert rc == 0
    r = json.loads(out.read_text())["results"]["run"]
    assert r["early_stops"] == {"duet_aborted": 8}  # 2 steps x 4 samples, none kept
    assert r["mean_response_tokens"] == 2.0
