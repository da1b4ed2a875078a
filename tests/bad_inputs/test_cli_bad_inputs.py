"""Every bad input of the config is refused when it loads: `reroll train` exits 2 with one
line naming the key (and the valid range), and the run directory is not created or
changed: neither a directory that did not exist nor an existing run's directory (every file
byte-identical, no mtime changed). Values that are legal but almost surely wrong give a
warning naming the key."""

import os
import re
import warnings

import pytest

from reroll.cli import main
from reroll.config_checks import load_checked

REFUSED = [
    (["train.lr=-1e-3"], r"train.lr must be in \(0, inf\), got -0.001"),
    (["rollout.temperature=-1"], r"rollout.temperature must be in \[0, inf\), got -1"),
    (["rollout.top_p=0"], r"rollout.top_p must be in \(0, 1\], got 0"),
    (["rollout.top_p=1.5"], r"rollout.top_p must be in \(0, 1\], got 1.5"),
    (["reward.workers=-1"], r"reward.workers must be in \[0, inf\), got -1"),
    (["train.grad_clip=-1"], r"train.grad_clip must be in \[0, inf\), got -1"),
    (["eval.every=-5"], r"eval.every must be in \[0, inf\), got -5"),
    (["algo.surrogate_args.clip_high=-1"],
     r"surrogate 'ppo_clip' hyperparameter 'clip_high' .*algo.surrogate_args.* \[0, inf\)"),
    (["algo.correction_args.cap=-2"],
     r"correction 'tis_token' hyperparameter 'cap' .* must be in \(0, inf\), got -2"),
    (["algo.correction=mis_token", "algo.correction_args.upper=0"],
     r"'upper' .* must be in \(0, inf\), got 0"),
    (["runtime.overprovision=1.5"], r"runtime.overprovision = 1.5 with runtime.max_staleness "
                                    r"= 0 .* not be synchronous"),
    (["model.dtype=float16"], r"float16 on CPU .* use bfloat16 or float32"),
    (["model.device=gpu"], r"model.device must be auto, cpu, cuda or cuda:N, got 'gpu'"),
    (["model.device=cuda:99"], r"model.device = 'cuda:99' but torch sees"),  # any machine
    (["train.logprob_chunk=-1"], r"train.logprob_chunk must be in \[0, inf\), got -1"),
    (["train.micro_batch_tokens=-8"], r"train.micro_batch_tokens must be in \[0, inf\), got -8"),
    (['reward.verifiers=[{name="python", args={fn="nosuchmod:f"}}]'],
     r"cannot import module 'nosuchmod'"),
    (['reward.verifiers=[{name="python", args={fn="os.path:no_such_function"}}]'],
     r"module 'os.path' has no 'no_such_function'"),
    (["rollout.workflow=multi_turn"], r"needs an environment: set rollout.env"),
    (["rollout.env=calculator"], r"rollout.env = 'calculator' is used only by .*multi_turn"),
    (["rollout.workflow=multi_turn", "rollout.env=calculator", "rollout.env_args.max_calls=-1"],
     r"'max_calls' .* must be in \[0, inf\), got -1"),
    (["rollout.workflow=nope"], r"unknown workflow 'nope'"),
    (["engine.name=vllm"], r"unknown engine 'vllm'"),
    (["task.args.digits=0"], r"'digits' .* must be in \[1, 18\], got 0"),
    (["train.steps=-5"], r"train.steps must be in \[0, inf\), got -5"),
    (["model.num_kv_heads=3"], r"model.num_kv_heads = 3 must divide model.num_heads = 4"),
    (["model.num_heads=3", "model.num_kv_heads=1"],
     r"model.num_heads = 3 must divide model.hidden_size = 128"),
    (["train.schedule=linear", "train.steps=6", "train.schedule_steps=4"],
     r"decays the learning rate to 0 at update train.schedule_steps = 4, before "
     r"train.steps = 6"),
]


def tree(path):
    """Every entry under ``path`` (itself included): its mtime and, for a file, its bytes."""
    if not path.exists():
        return None
    return {str(p.relative_to(path)): (p.stat().st_mtime_ns,
                                       p.read_bytes() if p.is_file() else None)
            for p in [path, *sorted(path.rglob("*"))]}


@pytest.mark.parametrize("overrides,message", REFUSED, ids=[" ".join(o) for o, _ in REFUSED])
def test_bad_input_exits_2_naming_the_key_and_touches_nothing(tmp_path, capsys, overrides,
                                                               message):
    out = tmp_path / "run"
    before = tree(out)
    code = main(["train", "-", f"out_dir={out}", *overrides, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("reroll train: error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert tree(out) == before  # nothing created or changed


def test_a_reward_module_in_the_working_directory_is_importable(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(
        "def has_digit(prompts, completions, **kw):\n"
        "    return [float(any(c.isdigit() for c in completions[0]))]\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_checked(None, ['reward.verifiers=[{name="python", args={fn="my_reward:has_digit"}}]'])
    assert cfg.reward.verifiers[0]["args"]["fn"] == "my_reward:has_digit"


WARNED = [
    (["train.steps=0"], "train.steps = 0"),
    (["eval.every=10", "eval.n_examples=0"], "eval.n_examples = 0"),
    (["rollout.group_size=1"], "rollout.group_size = 1 with algo.advantage = 'grpo'"),
    (["runtime.kind=ray", "runtime.trainer_gpus=1", "runtime.engine_gpus=1", "model.device=auto",
      "eval.every=50"],
     "eval.every = 50 with runtime.trainer_gpus > 0: in-loop evaluation runs in the driver, "
     "on its CPU"),
    (["rollout.temperature=0"], "rollout.temperature = 0 samples greedily: the 8 samples of a "
                                "group are identical"),
    (["rollout.max_new_tokens=300"], r"rollout.max_new_tokens = 300 is not below the model's "
                                     r"context \(256 tokens, model.max_position\)"),
    (["model.max_position=8"], r"rollout.max_new_tokens = 8 is not below the model's context "
                               r"\(8 tokens, model.max_position\)"),
]


@pytest.mark.parametrize("overrides,message", WARNED, ids=[" ".join(o) for o, _ in WARNED])
def test_likely_mistakes_are_warned_about(overrides, message):
    with pytest.warns(UserWarning, match=message):
        load_checked(None, overrides)


def test_sensible_configs_load_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checked(None, [])
        load_checked(None, ["rollout.group_size=1", "algo.advantage=reinforce_pp"])
        # both sides reserve GPUs: with only the trainer's, engines left at auto land on a
        # GPU-less driver's CPU, which is warned about (tests/test_config.py)
        load_checked(None, ["runtime.kind=ray", "runtime.trainer_gpus=1", "runtime.engine_gpus=1",
                            "eval.every=0"])
        root = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
        for name in ("arithmetic", "calculator"):
            load_checked(os.path.join(root, "configs", f"{name}.toml"))


def test_a_prompt_longer_than_the_model_holds_is_found_when_the_data_loads(tmp_path, capsys):
    import json

    data = tmp_path / "d.jsonl"
    rows = [{"prompt": "1+1=", "answer": "2"}] * 3 + [{"prompt": "9" * 40 + "=", "answer": "9"}]
    data.write_text("".join(json.dumps(dict(r, id=str(i))) + "\n" for i, r in enumerate(rows)))
    args = ["train", "-", "task.name=jsonl", f'task.args={{path="{data}", id_field="id", '
            f'test_fraction=0.25}}', "model.max_position=32", "train.steps=1", "reward.workers=0",
            "rollout.group_size=2", "rollout.batch_groups=1", "runtime.threads=1",
            "--no-progress"]
    out = tmp_path / "run"
    assert main([*args, f"out_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert "prompt '3'" in err and "42 tokens" in err and "holds 32" in err and str(data) in err
    assert not (out / "config.toml").exists()  # the run did not start
    with pytest.warns(UserWarning, match="skipped 1 example"):
        assert main([*args, f"out_dir={tmp_path / 'skip'}", "task.skip_long_prompts=true"]) == 0


SMALL = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
         "task.args.n_test=8", "rollout.group_size=2", "rollout.batch_groups=2",
         "rollout.max_new_tokens=3", "reward.workers=0", "runtime.threads=1", "train.steps=1",
         "sft.steps=1", "sft.batch_size=4", "sft.warmup_steps=0"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An existing `reroll train` run and an existing `reroll sft` run (shared: the tests
    that use them must leave them unchanged)."""
    root = tmp_path_factory.mktemp("existing")
    assert main(["train", "-", *SMALL, f"out_dir={root / 'train'}", "--no-progress"]) == 0
    assert main(["sft", "-", *SMALL, f"out_dir={root / 'sft'}"]) == 0
    assert (root / "train" / "checkpoints" / "latest").is_file()
    assert (root / "sft" / "config.toml").is_file() and (root / "sft" / "model").is_dir()
    return root


RESUME_REFUSED = REFUSED + [
    (["rollout.group_size=4"], r"cannot resume .*config differs .*rollout.group_size: 2 -> 4"),
]


@pytest.mark.parametrize("overrides,message", RESUME_REFUSED,
                         ids=[" ".join(o) for o, _ in RESUME_REFUSED])
def test_bad_input_to_a_resume_leaves_the_existing_run_untouched(runs, capsys, overrides,
                                                                 message):
    out = runs / "train"
    before = tree(out)
    code = main(["train", "-", *SMALL, f"out_dir={out}", *overrides, "--resume",
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("reroll train: error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert tree(out) == before  # every file byte-identical, no mtime changed


def test_train_into_an_existing_run_without_resume_is_refused_and_touches_nothing(runs,
                                                                                   capsys):
    out = runs / "train"
    before = tree(out)
    assert main(["train", "-", *SMALL, f"out_dir={out}", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "already holds a run" in err and "pass --resume to continue it" in err, err
    assert tree(out) == before


@pytest.mark.parametrize("existing", ["sft", "train"])
def test_sft_into_an_existing_run_is_refused_and_touches_nothing(runs, capsys, existing):
    out = runs / existing
    before = tree(out)
    assert main(["sft", "-", *SMALL, f"out_dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("reroll sft: error: ") and err.count("\n") == 1, err
    assert f"run directory {str(out)!r} already holds a run" in err, err
    assert err.rstrip().endswith("pass --resume to continue it or set out_dir to a new "
                                 "directory"), err
    assert tree(out) == before


@pytest.mark.parametrize("command", [["sft"], ["eval", "--checkpoint", "nowhere"], ["config"]])
def test_every_command_that_loads_a_config_refuses_a_bad_one_first(tmp_path, capsys, command):
    """Loading only parses; each command checks the config before it does anything (`reroll
    train` through `reroll.runtime.train`, covered above)."""
    out = tmp_path / "run"
    code = main([command[0], "-", f"out_dir={out}", "train.lr=0", *command[1:]])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(f"reroll {command[0]}: error: train.lr must be in (0, inf)"), err
    assert not out.exists()


def test_a_presets_key_overridden_by_the_config_is_said():
    with pytest.warns(UserWarning, match=r"preset 'mc_grpo' sets rollout.group_size = 3; the "
                                         r"config's 8 is used"):
        assert load_checked(None, ["preset=mc_grpo", "rollout.group_size=8"]).rollout \
            .group_size == 8
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_checked(None, ["preset=mc_grpo", "rollout.group_size=3"])  # the same: no word
