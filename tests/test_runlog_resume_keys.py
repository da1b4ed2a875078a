"""Which config changes a resume accepts: where engine servers are (they move between a stop
and a resume) is not what shapes a run; the algorithm is."""

from reroll.runlog import config_diff


def test_a_resume_accepts_moved_servers_and_refuses_a_changed_algorithm():
    old = {"engine": {"name": "openai", "base_url": "http://a:1", "api_key": "x",
                      "timeout_s": 30.0, "weights_dir": "/tmp/a"},
           "algo": {"advantage": "grpo"}}
    new = {"engine": {"name": "openai", "base_url": ["http://b:2", "http://c:3"],
                      "api_key": "y", "timeout_s": 60.0, "weights_dir": "/tmp/b"},
           "algo": {"advantage": "grpo"}}
    assert config_diff(old, new) == []
    new["algo"]["advantage"] = "rloo"
    new["engine"]["name"] = "torch"
    assert config_diff(old, new) == ["algo.advantage: 'grpo' -> 'rloo'",
                                     "engine.name: 'openai' -> 'torch'"]


def test_the_run_directory_never_records_the_api_key(tmp_path):
    from reroll.config import RunConfig, read_toml
    from reroll.runlog import RunDir

    cfg = RunConfig()
    cfg.out_dir = str(tmp_path / "run")
    cfg.engine.api_key = "secret-token-123"
    run = RunDir(cfg)
    run.commit()
    text = (tmp_path / "run" / "config.toml").read_text()
    assert "secret-token-123" not in text
    assert read_toml(tmp_path / "run" / "config.toml")["engine"]["api_key"] == ""
    assert cfg.engine.api_key == "secret-token-123"  # the running config keeps it
    run.close()
    cfg.engine.api_key = "another-token"  # a resume with the key again is accepted
    RunDir(cfg, resume=True).close()


def test_a_resume_may_move_the_run_onto_other_kernels_and_devices_but_not_other_math():
    """Which AdamW kernel, which kernels at all, where the trainer and the engine run (a
    run started with model.device=cpu may resume on a GPU, or with trainer_gpus), what GPUs Ray
    actors reserve are resumable (the same update up to float rounding); the lr is not."""
    old = {"train": {"fused_optimizer": False, "lr": 1e-4},
           "runtime": {"deterministic": False, "engine_gpus": 0.0, "trainer_gpus": 0.0},
           "engine": {"device": ""}, "model": {"device": "cpu"}}
    new = {"train": {"fused_optimizer": True, "lr": 1e-4},
           "runtime": {"deterministic": True, "engine_gpus": 1.0, "trainer_gpus": 1.0},
           "engine": {"device": "cuda:1"}, "model": {"device": "cuda:0"}}
    assert config_diff(old, new) == []
    new["train"]["lr"] = 3e-4
    assert config_diff(old, new) == ["train.lr: 0.0001 -> 0.0003"]
