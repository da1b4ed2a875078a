"""`reroll replay`: a real run recorded, then trained again from its recorded rollouts. With
the run's own settings every logged update metric and the final weights are bitwise the
run's (synchronous and at max_staleness 1); under another preset it runs and differs; keys
that shaped generation are refused by name; a stopped replay resumes to the same weights."""

import argparse
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from reroll.recording import retrain
from reroll.recording.store import RolloutStore
from reroll.runlog import read_metrics
from reroll.runtime import train

# metrics of the rollout pipeline and wall time: a replay has no generation to measure
NOT_REPLAYED = ("time", "throughput/", "pipeline/", "engine/", "score_errors/")


def replay(run_dir, *overrides: str) -> int:
    ap = argparse.ArgumentParser()
    retrain.add_parser(ap.add_subparsers())
    return retrain.run(ap.parse_args(["replay", str(run_dir), *overrides, "--no-progress"]))


def weights(run_dir, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" /
                         "model.safetensors"))


def update_metrics(run_dir) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(NOT_REPLAYED)}
            for row in read_metrics(run_dir)]


def assert_bitwise(a, b, steps: int) -> None:
    rows_a, rows_b = update_metrics(a), update_metrics(b)
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b]
    assert rows_a == rows_b  # loss, grad norm, clip and IS statistics, entropy, lr, eval...
    assert any("grad_norm" in r and "loss/policy" in r for r in rows_a)
    wa, wb = weights(a, steps), weights(b, steps)
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("staleness, preset", [(0, ""), (1, ""), (0, "grpo")])
def test_replay_with_the_runs_settings_reproduces_it_bitwise(tmp_path, small_run, staleness,
                                                             preset):
    """5 steps with a held-out evaluation at steps 0 and 5 (the evaluation runs the replayed
    policy through the engine, as training does); at staleness 1 the recorded behaviour
    log-probs make the importance weights, hence the updates, the run's too; the grpo
    preset's KL term in the loss needs the same reference model (the run's initial one)."""
    run = tmp_path / "run"
    train(small_run(run, "train.steps=5", "eval.every=5", "eval.n_examples=8",
                    f"runtime.max_staleness={staleness}", f"preset={preset}"), progress=False)
    assert RolloutStore(run).steps() == [1, 2, 3, 4, 5]
    assert replay(run, f"out_dir={tmp_path / 'again'}") == 0
    assert_bitwise(run, tmp_path / "again", 5)
    rows = read_metrics(tmp_path / "again")
    assert "eval/greedy_accuracy" in rows[0] and "eval/greedy_accuracy" in rows[-1]
    if staleness:  # the run did train on tokens one version old
        assert max(r.get("staleness/max_lag", 0) for r in rows) == 1.0


def test_replay_under_another_preset_trains_differently_on_the_same_batches(
        tmp_path, small_run, capsys):
    run = tmp_path / "run"
    train(small_run(run, "train.steps=3"), progress=False)
    # the preset's own correction is its paper's "none" (on-policy); these batches are
    # off-policy from step 2 on, so the replay names one that reweighs them
    assert replay(run, "preset=rloo", "algo.correction=tis_token",
                  f"out_dir={tmp_path / 'rloo'}") == 0
    err = capsys.readouterr().err
    assert "off-policy from step 2 on" in err and "tis_token" in err
    from reroll.config import read_toml

    algo = read_toml(tmp_path / "rloo" / "config.toml")["algo"]
    assert (algo["advantage"], algo["surrogate"]) == ("rloo", "reinforce")
    a, b = read_metrics(run), read_metrics(tmp_path / "rloo")
    # the same batches: reward statistics are the recorded ones, the updates are not
    assert [r["reward/mean"] for r in a] == [r["reward/mean"] for r in b]
    assert a[0]["grad_norm"] != b[0]["grad_norm"]
    wa, wb = weights(run, 3), weights(tmp_path / "rloo", 3)
    assert any(not torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_a_stopped_replay_resumes_to_the_runs_weights(tmp_path, small_run, schedule):
    """Under a linear lr decay the replay of 3 of the run's 4 steps keeps the run's decay
    (over 4 updates), not one over the 3 it replays."""
    run = tmp_path / "run"
    train(small_run(run, "train.steps=4", "ckpt_every=2", f"train.schedule={schedule}"),
          progress=False)
    out = f"out_dir={tmp_path / 'again'}"
    assert replay(run, out, "train.steps=3", "ckpt_every=2") == 0
    # as if killed after step 3's row: the resume starts at the checkpoint of step 2
    shutil.rmtree(tmp_path / "again" / "checkpoints" / "step_000003")
    (tmp_path / "again" / "checkpoints" / "latest").write_text("step_000002")
    ap = argparse.ArgumentParser()
    retrain.add_parser(ap.add_subparsers())
    args = ap.parse_args(["replay", str(run), out, "train.steps=4", "ckpt_every=2",
                          "--resume", "--no-progress"])
    assert retrain.run(args) == 0
    assert_bitwise(run, tmp_path / "again", 4)


@pytest.fixture()
def recorded(tmp_path, small_run):
    """A run directory with a config and recorded steps 1-3, and no training (what the
    refusals need)."""
    from reroll.rollout import Example, SamplingParams, new_group
    from reroll.runlog import RunDir

    rd = RunDir(small_run(tmp_path / "run", "train.steps=3"))
    rd.commit()
    for s in (1, 2, 3):
        rd.record(s, [new_group(Example("p", "1+1=", "2"), 2, [1, 2], SamplingParams(), 0)])
    rd.close()
    return tmp_path / "run"


@pytest.mark.parametrize("override, named", [
    ("rollout.group_size=8", "rollout.group_size cannot change in a replay: it shaped what "
                             "was generated"),
    ("task.args.digits=2", "task.args.digits cannot change"),
    ("algo.dynamic_sampling=true", "algo.dynamic_sampling cannot change in a replay: it "
                                   "decided which groups were kept"),
    ("runtime.max_staleness=2", "runtime.max_staleness cannot change"),
    ("init=runs/x", "init cannot change in a replay: it is where the run started"),
    ("model.hidden_size=64", "model.hidden_size cannot change"),
])
def test_keys_that_shaped_generation_are_refused_by_name(recorded, tmp_path, override, named):
    from reroll.config import ConfigError

    with pytest.raises(ConfigError, match="A replay changes the update only") as e:
        replay(recorded, override, f"out_dir={tmp_path / 'out'}")
    assert named in str(e.value)
    assert not (tmp_path / "out").exists()


def test_bad_replays_are_named(recorded, tmp_path):
    from reroll.config import ConfigError

    with pytest.raises(ConfigError, match="replay needs out_dir=DIR"):
        replay(recorded)
    with pytest.raises(ConfigError, match="out_dir is the recorded run"):
        replay(recorded, f"out_dir={recorded}")
    with pytest.raises(ConfigError, match=r"has steps 1-3 recorded, the replay needs 1-5: "
                                          r"pass train.steps=N"):
        replay(recorded, "train.steps=5", f"out_dir={tmp_path / 'out'}")
    with pytest.raises(ConfigError, match="unknown config key 'algo.advantag'"):
        replay(recorded, "algo.advantag=rloo", f"out_dir={tmp_path / 'out'}")
    with pytest.raises(ConfigError, match="holds no run"):
        replay(tmp_path / "nothing", f"out_dir={tmp_path / 'out'}")
    # steps 2 and 4 of a run with record_every = 2
    shutil.rmtree(recorded / "rollouts")
    cfg_file = recorded / "config.toml"
    cfg_file.write_text(cfg_file.read_text().replace("record_every = 1", "record_every = 2"))
    with pytest.raises(ConfigError, match=r"no step from 1 on recorded.*record_every = 2\); "
                                          r"a replay needs every step"):
        replay(recorded, f"out_dir={tmp_path / 'out'}")


def test_module_entry_point_refuses_with_exit_code_2(recorded, tmp_path):
    r = subprocess.run([sys.executable, "-m", "reroll.recording.retrain", str(recorded),
                        "preset=rloo", "rollout.temperature=0.5", f"out_dir={tmp_path / 'o'}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "reroll replay: error: rollout.temperature cannot change in a replay" in r.stderr


def test_reroll_replay_through_the_main_cli_refuses_with_exit_code_2(recorded, tmp_path, capsys):
    from reroll.cli import main

    assert main(["replay", str(recorded), "rollout.group_size=8",
                 f"out_dir={tmp_path / 'o'}"]) == 2
    assert "rollout.group_size cannot change in a replay" in capsys.readouterr().err


def test_a_run_recorded_before_the_fused_optimizer_replays_with_torchs_default_adamw(
        recorded, tmp_path):
    """train.fused_optimizer's default is on; a recording whose config.toml predates the key
    ran torch's default AdamW, and its replay must too to reproduce it. A recording that
    names the key keeps its value, and the replay may override it (a kernel choice)."""
    import tomli_w

    from reroll.config import read_toml

    cfg_file = recorded / "config.toml"
    assert read_toml(cfg_file)["train"]["fused_optimizer"] is True  # recorded since the key
    out = [f"out_dir={tmp_path / 'again'}"]
    assert retrain.replay_config(recorded, out, []).train.fused_optimizer is True
    assert retrain.replay_config(recorded, out + ["train.fused_optimizer=false"],
                                 []).train.fused_optimizer is False
    old = read_toml(cfg_file)
    del old["train"]["fused_optimizer"]
    cfg_file.write_text(tomli_w.dumps(old))
    assert retrain.replay_config(recorded, out, []).train.fused_optimizer is False


def test_a_run_recorded_on_ray_across_gpus_replays_here_in_this_process(recorded, tmp_path):
    """Where the recorded run's actors ran (runtime.kind, the GPU reservations, Ray's scoring
    actors, engine.device) does not bind its replay, which trains in this process: the
    placement is reset to the local runtime's, so a run recorded with its engine on a second
    GPU replays on a machine without one, and model.device / engine.device may be set."""
    import tomli_w

    from reroll.config import ConfigError, read_toml

    cfg_file = recorded / "config.toml"
    data = read_toml(cfg_file)
    data["runtime"].update(kind="ray", engine_gpus=1.0, trainer_gpus=1.0, scoring_workers=2)
    data["engine"]["device"] = "cuda:1"
    data["model"]["device"] = "cuda"
    cfg_file.write_text(tomli_w.dumps(data))
    out = [f"out_dir={tmp_path / 'again'}"]
    notes = []
    cfg = retrain.replay_config(recorded, out + ["model.device=cpu", "engine.device=cpu"], notes)
    assert (cfg.runtime.kind, cfg.runtime.engine_gpus, cfg.runtime.trainer_gpus,
            cfg.runtime.scoring_workers) == ("local", 0.0, 0.0, 0)
    assert (cfg.model.device, cfg.engine.device) == ("cpu", "cpu")
    assert notes == ["the recorded run's placement (runtime.kind = 'ray', runtime.engine_gpus "
                     "= 1.0, runtime.trainer_gpus = 1.0, runtime.scoring_workers = 2, "
                     "engine.device = 'cuda:1') does not apply: a replay trains in this "
                     "process (set model.device / engine.device to choose devices)"]
    with pytest.raises(ConfigError, match=r"runtime.trainer_gpus cannot change in a replay: "
                                          r"it is where the recorded run's actors ran \(a "
                                          r"replay trains in this process\)\. A replay"):
        retrain.replay_config(recorded, out + ["runtime.trainer_gpus=1"], [])
    # a recorded GPU this machine lacks: auto, said; one the user names is checked as named
    data["model"]["device"] = "cuda:99"
    cfg_file.write_text(tomli_w.dumps(data))
    notes = []
    assert retrain.replay_config(recorded, out, notes).model.device == "auto"
    assert notes[-1].startswith("model.device = 'cuda:99' as recorded, but torch sees ")
    with pytest.raises(ConfigError, match=r"model.device = 'cuda:99' but torch sees"):
        retrain.replay_config(recorded, out + ["model.device=cuda:99"], [])
