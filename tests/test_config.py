"""Config: TOML + overrides with type conversion, and clear errors for bad input."""

from pathlib import Path

import pytest

from reroll.config import (
    ConfigError,
    RunConfig,
    build,
    dump_toml,
    field_ranges,
    load_config,
    parse_value,
)
from reroll.config_checks import load_checked


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_overrides_convert_types(tmp_path):
    p = write(tmp_path, '[train]\nlr = 1e-3\n[task]\nname = "arithmetic"\n')
    cfg = load_config(p, ["train.lr=3e-4", "train.steps=7", "runtime.partial_rollouts=false",
                          "task.args.digits=3", "model.arch=llama", "train.grad_clip=2"])
    assert cfg.train.lr == 3e-4 and cfg.train.steps == 7
    assert cfg.runtime.partial_rollouts is False
    assert cfg.task.args == {"digits": 3}
    assert cfg.model.arch == "llama" and cfg.train.grad_clip == 2.0


def test_unknown_key_names_key_and_closest(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown config key 'train.lrr'.*'train.lr'"):
        load_config(write(tmp_path, "[train]\nlrr = 1\n"))
    with pytest.raises(ConfigError, match=r"unknown config key 'rollout.grup_size'"):
        load_config(None, ["rollout.grup_size=4"])


def test_wrong_type_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="train.steps: expected an integer"):
        load_config(None, ["train.steps=many"])
    with pytest.raises(ConfigError, match="train.steps: expected an integer"):
        load_config(None, ["train.steps=2.5"])
    with pytest.raises(ConfigError, match="runtime.partial_rollouts: expected true/false"):
        load_config(None, ["runtime.partial_rollouts=maybe"])
    with pytest.raises(ConfigError, match="train: expected a table"):
        load_config(None, ["train=3"])


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_checked(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_checked(write(tmp_path, "[train\n"))


def test_registry_choices_checked_at_load():
    with pytest.raises(ConfigError, match="unknown advantage 'grp'.*did you mean 'grpo'"):
        load_checked(None, ["algo.advantage=grp"])
    with pytest.raises(ConfigError, match="no hyperparameter 'clip'"):
        load_checked(None, ["algo.surrogate_args.clip=0.3"])
    with pytest.raises(ConfigError, match="unknown task"):
        load_checked(None, ["task.name=chess"])


def test_parse_value_and_dump_round_trip():
    assert parse_value("3") == 3 and parse_value("true") is True
    assert parse_value("[1, 2]") == [1, 2] and parse_value("hello") == "hello"
    import tomllib

    cfg = load_checked(None, ["train.steps=5", "task.args.digits=1"])
    again = build(RunConfig, tomllib.loads(dump_toml(cfg)))
    assert again == cfg


def test_sft_schedule_checked_at_load():
    with pytest.raises(ConfigError, match="sft.schedule must be one of constant, linear, got 'cosine'"):
        load_checked(None, ["sft.schedule=cosine"])
    with pytest.raises(ConfigError, match="train.schedule must be one of constant, linear, got 'cos'"):
        load_checked(None, ["train.schedule=cos"])


def test_shaping_with_a_components_only_advantage_is_rejected():
    # gdpo normalises reward components; a scalar-reward penalty would silently do nothing
    with pytest.raises(ConfigError, match="algo.overlong_buffer would have no effect"):
        load_checked(None, ["algo.advantage=gdpo", "algo.overlong_buffer=2"])
    with pytest.raises(ConfigError, match="algo.kl_in_reward would have no effect"):
        load_checked(None, ["algo.advantage=gdpo", "algo.kl_in_reward=true", "algo.kl_coef=0.1"])
    load_checked(None, ["algo.advantage=gdpo", "algo.kl_coef=0.1"])  # KL in the loss is fine


def test_gpu_reservations_need_the_ray_runtime_and_a_gpu_device():
    for key in ("engine_gpus", "trainer_gpus"):
        with pytest.raises(ConfigError, match=f'runtime.{key} reserves GPUs for Ray actors: '
                                               'it needs runtime.kind = "ray"'):
            load_checked(None, [f"runtime.{key}=1"])
        with pytest.raises(ConfigError, match=f"runtime.{key} > 0 .* model.device must be "
                                               "auto or cuda, got 'cpu'"):
            load_checked(None, ["runtime.kind=ray", f"runtime.{key}=1", "model.device=cpu"])
        with pytest.raises(ConfigError, match=rf"runtime.{key} must be in \[0, inf\), got -1"):
            load_checked(None, ["runtime.kind=ray", f"runtime.{key}=-1"])
    with pytest.raises(ConfigError, match="model.device must be auto or cuda, got 'cuda:1'"):
        load_checked(None, ["runtime.kind=ray", "runtime.trainer_gpus=1", "model.device=cuda:1"])
    with pytest.raises(ConfigError, match="runtime.engine_gpus = 1.5: more than one GPU must "
                                           "be a whole number"):
        load_checked(None, ["runtime.kind=ray", "runtime.engine_gpus=1.5"])
    # each side on its own: GPUs reserved for the engines only leave the trainer's device to
    # the driver's check, and a trainer on the CPU is fine beside engines on their own GPUs
    with pytest.raises(ConfigError, match="model.device = 'cuda:99' but torch sees"):
        load_checked(None, ["runtime.kind=ray", "runtime.engine_gpus=1", "model.device=cuda:99",
                             "engine.device=cuda"])
    cfg = load_checked(None, ["runtime.kind=ray", "runtime.engine_gpus=1", "model.device=cpu",
                               "engine.device=cuda"])
    assert (cfg.model.device, cfg.engine.device) == ("cpu", "cuda")
    # "cuda" is the actors' to check (a CPU-only driver, as on a cluster's head node, is fine)
    cfg = load_checked(None, ["runtime.kind=ray", "runtime.engine_gpus=0.5",
                               "runtime.trainer_gpus=1", "model.device=cuda"])
    assert (cfg.runtime.engine_gpus, cfg.runtime.trainer_gpus) == (0.5, 1.0)
    with pytest.raises(ConfigError, match="model.device = 'cuda:99' but torch sees"):
        load_checked(None, ["runtime.kind=ray", "model.device=cuda:99"])  # no reservation: here


def test_engine_device_is_checked_like_model_device():
    with pytest.raises(ConfigError, match="engine.device must be auto, cpu, cuda or cuda:N, "
                                           "got 'gpu'"):
        load_checked(None, ["engine.device=gpu"])
    with pytest.raises(ConfigError, match="engine.device = 'cuda:99' but torch sees"):
        load_checked(None, ["engine.device=cuda:99"])
    with pytest.raises(ConfigError, match="engine.device places the torch engine's model; "
                                           "engine.name = 'openai'"):
        load_checked(None, ["engine.name=openai", 'engine.base_url="http://127.0.0.1:1"',
                             "engine.device=cpu"])
    with pytest.raises(ConfigError, match="runtime.engine_gpus > 0 .* engine.device must be "
                                           "auto or cuda, got 'cpu'"):
        load_checked(None, ["runtime.kind=ray", "runtime.engine_gpus=1", "engine.device=cpu"])
    assert load_checked(None, ["engine.device=cpu"]).engine.device == "cpu"


def test_scoring_actors_need_the_ray_runtime():
    with pytest.raises(ConfigError, match='runtime.scoring_workers .* needs runtime.kind = "ray"'):
        load_checked(None, ["runtime.scoring_workers=2"])
    with pytest.raises(ConfigError, match=r"runtime.scoring_workers must be in \[0, inf\), got -1"):
        load_checked(None, ["runtime.kind=ray", "runtime.scoring_workers=-1"])
    assert load_checked(None, ["runtime.kind=ray", "runtime.scoring_workers=2"]).runtime.scoring_workers == 2


def test_a_ray_side_without_gpus_beside_one_with_them_is_warned_when_it_lands_on_the_cpu():
    """With only the engines reserving GPUs, the trainer actor takes model.device=auto as the
    driver resolves it: on a driver without a GPU, the CPU; said, not left silent. Both
    sides reserving (or neither) says nothing."""
    import warnings

    import torch

    if torch.cuda.is_available():
        pytest.skip("the driver resolves auto to cuda here")
    with pytest.warns(UserWarning, match=r"runtime.engine_gpus > 0 but the trainer actor\(s\) "
                                          r"reserve no GPU: they take model.device = 'auto'"):
        load_checked(None, ["runtime.kind=ray", "runtime.engine_gpus=1", "eval.every=0"])
    with pytest.warns(UserWarning, match=r"runtime.trainer_gpus > 0 but the engine actor\(s\) "
                                          r"reserve no GPU: they take model.device = 'auto'"):
        load_checked(None, ["runtime.kind=ray", "runtime.trainer_gpus=1", "eval.every=0"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checked(None, ["runtime.kind=ray", "runtime.trainer_gpus=1",
                             "runtime.engine_gpus=1", "eval.every=0"])


def test_no_correction_on_samples_of_older_policies_is_warned():
    """The synchronous presets train with algo.correction = "none" (their papers' setting);
    stale samples under it would train with no behaviour weight: said (replayed or reused
    ones are refused outright). A synchronous run with "none", or a stale one with a
    correction, says nothing."""
    import warnings

    with pytest.warns(UserWarning, match=r'algo.correction = "none" with '
                                          r"runtime.max_staleness = 2: samples of older"):
        load_checked(None, ["preset=dapo", "runtime.max_staleness=2"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checked(None, ["preset=dapo"])
        load_checked(None, ["runtime.max_staleness=2"])  # the default tis_token


def test_ranges_live_in_the_fields_and_load_config_checks_only_keys_and_types(tmp_path):
    """Each numeric field's interval sits in its field's metadata; loading parses and types
    the config, and the range walk (`validate`, run by `load_checked` and by every command
    that starts work) refuses a value outside it, naming the key and the interval."""
    ranges = field_ranges(RunConfig)
    assert ranges["train.lr"] == "(0, inf)" and ranges["rollout.top_p"] == "(0, 1]"
    assert ranges["log_every"] == "[1, inf)" and ranges["reward.timeout_s"] == "(0, inf)"
    assert load_config(None, ["train.lr=0"]).train.lr == 0  # parsed, not yet checked
    with pytest.raises(ConfigError, match=r"^train.lr must be in \(0, inf\), got 0.0$"):
        load_checked(None, ["train.lr=0"])
    with pytest.raises(ConfigError, match=r"^rollout.top_p must be in \(0, 1\], got 1.5$"):
        load_checked(None, ["rollout.top_p=1.5"])
    with pytest.raises(ConfigError, match=r"^runtime.overprovision must be in \[1, inf\)"):
        load_checked(None, ["runtime.overprovision=0.5"])


def test_training_refuses_a_bad_config_before_any_work(tmp_path):
    from reroll.runtime import train

    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"train.micro_batch must be in \[1, inf\), got 0"):
        train(load_config(None, ["train.micro_batch=0", f"out_dir={out}"]), progress=False)
    assert not out.exists()


def test_device_names_resolve_in_one_place():
    from reroll.devices import cuda_index, engine_device, is_cuda_name, resolve_device

    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:1") == "cuda:1"
    assert resolve_device("auto") in ("cpu", "cuda")
    assert cuda_index("cuda") == 0 and cuda_index("cuda:3") == 3
    assert is_cuda_name("cuda:2") and not is_cuda_name("gpu")
    cfg = load_config(None, ["model.device=cpu"])
    assert engine_device(cfg) == "cpu"
    assert engine_device(load_config(None, ["model.device=cpu", "engine.device=auto"])) == "auto"


def test_choice_fields_declare_their_values_and_are_refused_naming_key_and_values():
    """A field with a fixed set of values declares them in its metadata beside the ranges;
    the same walk refuses another value, naming the key and every allowed value."""
    from reroll.runtime import RUNTIMES

    ranges = field_ranges(RunConfig)
    assert ranges["runtime.kind"] == "{local, ray}"
    assert ranges["model.dtype"] == "{float32, bfloat16, float16}"
    assert ranges["reward.inline"] == "{auto, always, never}"
    assert ranges["log.wandb_mode"] == "{online, offline, disabled}"
    assert set(RUNTIMES) == {"local", "ray"}  # every declared runtime.kind has a runtime
    for override, msg in (
            ("runtime.kind=k8s", "runtime.kind must be one of local, ray, got 'k8s'"),
            ("model.dtype=fp8", "model.dtype must be one of float32, bfloat16, float16, got 'fp8'"),
            ("reward.inline=sometimes",
             "reward.inline must be one of auto, always, never, got 'sometimes'"),
            ("log.wandb_mode=cloud",
             "log.wandb_mode must be one of online, offline, disabled, got 'cloud'")):
        assert load_config(None, [override])  # parsed, not yet checked
        with pytest.raises(ConfigError, match=f"^{msg}$"):
            load_checked(None, [override])


JOB = Path(__file__).resolve().parent.parent / "configs" / "reasoning.toml"


def test_the_stacked_preset_takes_effect_on_the_reasoning_job():
    """preset=stacked (async one version ahead, SIRI's length schedule, VADE's prompts) on
    configs/reasoning.toml: the job leaves runtime.max_staleness at its default so the
    preset's 1 holds, with a behaviour correction and no override warning; the job alone
    stays synchronous with the fixed limit."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = load_checked(str(JOB), ["preset=stacked"])
    assert (cfg.runtime.max_staleness, cfg.control.length, cfg.control.selector) == (
        1, "siri", "vade")
    assert cfg.algo.correction != "none"
    plain = load_checked(str(JOB), [])
    assert (plain.runtime.max_staleness, plain.control.length, plain.control.selector) == (
        0, "fixed", "uniform")
