"""The RL loop end to end on a tiny model: reward rises; a stopped-and-resumed run ends with
the same parameters as an uninterrupted one (bitwise); max_staleness = 0 is exactly a plain
synchronous loop; bad input gets a clear error and overwrites nothing."""

import copy

import pytest
import torch
from safetensors.torch import load_file

from reroll import build, build_rollout
from reroll.config import ConfigError
from reroll.config_checks import load_checked
from reroll.runlog import read_metrics, read_rollouts
from reroll.runtime import train

SMALL = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
         "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
         "rollout.max_new_tokens=4", "reward.workers=0", "log_every=1", "train.lr=3e-4",
         "runtime.threads=1"]
# An untrained model never gets a sum right: all-zero groups have zero advantage and the
# weights would never move, so equivalence tests would compare two idle runs. This reward
# ("a digit anywhere in the completion") gives every step a gradient.
SIGNAL = ['reward.verifiers=[{name="format", args={pattern="[0-9]", fullmatch=false}}]']
DEVICE = ["model.device=cpu"]  # the runs' models go on --device (set by _on_device)


@pytest.fixture(scope="module", autouse=True)  # before the module-scoped runs
def _on_device(on_device):
    DEVICE[:] = on_device


def small_cfg(out, *extra):
    return load_checked(None, SMALL + DEVICE + [f"out_dir={out}", *extra])


def weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" /
                         "model.safetensors"))


def assert_trained(run_dir, step):
    """The run really updated the weights (a nonzero gradient at every logged step)."""
    rows = [m for m in read_metrics(run_dir) if m["step"] <= step]
    assert rows and all(m["grad_norm"] > 0 for m in rows)
    w0 = load_file(str(run_dir / "init" / "model.safetensors"))
    w = weights(run_dir, step)
    assert any(not torch.equal(w0[k], w[k]) for k in w)


def test_resume_gives_bitwise_identical_parameters(tmp_path):
    a = tmp_path / "a"
    train(small_cfg(a, "train.steps=4", "ckpt_every=2", *SIGNAL), progress=False)
    b = tmp_path / "b"
    train(small_cfg(b, "train.steps=2", "ckpt_every=2", *SIGNAL), progress=False)
    train(small_cfg(b, "train.steps=4", "ckpt_every=2", *SIGNAL), resume=True, progress=False)
    assert_trained(a, 4)
    wa, wb = weights(a, 4), weights(b, 4)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k
    assert [m["step"] for m in read_metrics(b)] == [1, 2, 3, 4]
    ids = [g["group_id"] for _, g in read_rollouts(b)]
    assert len(ids) == 16 and len(set(ids)) == 16  # 4 steps x 4 groups, none twice


def test_staleness_zero_equals_a_plain_synchronous_loop(tmp_path):
    from reroll.algo import build_objective
    from reroll.control.prompts import PromptStream
    from reroll.control.scheduler import request_seed
    from reroll.rollout import new_group
    from reroll.trainer.options import TrainerOptions
    from reroll.trainer.step import Trainer

    cfg = small_cfg(tmp_path / "loop", "train.steps=3", "ckpt_every=3", *SIGNAL)
    train(cfg, progress=False)
    assert_trained(tmp_path / "loop", 3)

    # the textbook synchronous loop, written out with the same components
    model, tok = build.load_model(tmp_path / "loop" / "init", cfg)
    engine = build.build_engine(model, tok, cfg)
    task = build.build_task(cfg)
    scorer = build_rollout.build_scorer(cfg, task)
    trainer = Trainer(model, build_objective(cfg.algo),
                      TrainerOptions(pad_id=tok.pad_token_id, lr=cfg.train.lr,
                                     grad_clip=cfg.train.grad_clip,
                                     micro_batch=cfg.train.micro_batch))
    prompts, encode = PromptStream(task.train, cfg.train.seed), build_rollout.encode_prompt(tok)
    seq = 0
    for _ in range(3):
        groups = []
        for _ in range(cfg.rollout.batch_groups):
            ex = prompts.next()
            g = new_group(ex, cfg.rollout.group_size, encode(ex.prompt),
                          build_rollout.sampling_params(cfg, tok), trainer.version)
            for r in g.rollouts:
                r.sampling.seed = request_seed(cfg.train.seed, seq, r.index_in_group)
            seq += 1
            groups.append(g)
        engine.generate([r for g in groups for r in g.rollouts])
        for g in groups:
            for r in g.rollouts:
                r.scores = scorer.submit(r, g.example).result()
                r.reward = scorer.combine(r.scores)
        trainer.step(groups)
        engine.update_weights(copy.deepcopy(model.state_dict()), trainer.version)
    scorer.close()
    got = weights(tmp_path / "loop", 3)
    for k, v in model.state_dict().items():
        if k in got:
            assert torch.equal(got[k], v.cpu()), k


def test_reward_rises_after_brief_warm_start(tmp_path):
    from reroll.trainer.sft import save_model, sft

    cfg = small_cfg(tmp_path / "sft")
    model, tok = build.load_model(build.model_dir(cfg, tmp_path / "sft"), cfg)
    task = build.build_task(cfg)
    sft(model, tok, task.train, build_rollout.encode_prompt(tok), steps=100, lr=3e-3, batch_size=64,
        schedule="linear")
    save_model(model, tok, tmp_path / "sft" / "model")
    rl = small_cfg(tmp_path / "rl", f"init={tmp_path / 'sft'}", "train.steps=80",
                   "rollout.batch_groups=16", "rollout.group_size=8", "ckpt_every=1000",
                   "train.lr=5e-4")
    train(rl, progress=False)
    rewards = [m["reward/mean"] for m in read_metrics(tmp_path / "rl")]
    first, last = sum(rewards[:10]) / 10, sum(rewards[-20:]) / 20
    assert last > first + 0.1, (first, last)  # measured: 0.28 -> 0.53


def test_bad_input_is_refused_without_overwriting(tmp_path):
    out = tmp_path / "run"
    train(small_cfg(out, "train.steps=1"), progress=False)
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="already holds a run"):
        train(small_cfg(out, "train.steps=2"), progress=False)
    with pytest.raises(ConfigError, match="config differs.*rollout.group_size"):
        train(small_cfg(out, "train.steps=2", "rollout.group_size=2"), resume=True,
              progress=False)
    with pytest.raises(ConfigError, match="holds no run"):
        train(small_cfg(tmp_path / "empty"), resume=True, progress=False)
    assert (out / "metrics.jsonl").read_text() == before


def test_checkpoint_that_does_not_match_is_refused_with_exit_2(tmp_path, capsys):
    import shutil

    from reroll.cli import main

    out, other = tmp_path / "run", tmp_path / "other"
    train(small_cfg(out, "train.steps=1"), progress=False)
    train(small_cfg(other, "train.steps=1", "model.hidden_size=32", "model.intermediate_size=64"),
          progress=False)
    ck = out / "checkpoints" / "step_000001"
    shutil.copy(other / "checkpoints" / "step_000001" / "optimizer.pt", ck / "optimizer.pt")
    from reroll.trainer.checkpoint import write_manifest

    write_manifest(ck)  # a whole checkpoint, just of another model (damage is another test)
    files = {p: p.read_bytes() for p in [*ck.rglob("*"), out / "metrics.jsonl"] if p.is_file()}
    code = main(["train", "-", *SMALL, *DEVICE, f"out_dir={out}", "train.steps=2", "--resume",
                 "--no-progress"])
    assert code == 2
    assert "does not match the model/optimiser" in capsys.readouterr().err
    assert all(p.read_bytes() == b for p, b in files.items())  # nothing overwritten
    assert not (out / "checkpoints" / "step_000002").exists()


@pytest.mark.parametrize("preset", ["grpo", "dr_grpo", "dapo", "gspo", "rloo", "reinforce_pp",
                                    "mc_grpo", "gdpo"])
def test_every_preset_trains_a_few_steps(tmp_path, preset):
    cfg = small_cfg(tmp_path, f"preset={preset}", "train.steps=2", "ckpt_every=100", *SIGNAL)
    train(cfg, progress=False)
    rows = read_metrics(tmp_path)
    assert [m["step"] for m in rows] == [1, 2]
    assert all(0 < m["grad_norm"] < float("inf") for m in rows)  # a real, finite update


def test_dynamic_sampling_that_never_finds_a_group_stops_with_a_clear_error(tmp_path):
    # a format no completion can match: every group is all-zero, so every group is dropped
    cfg = small_cfg(tmp_path, "algo.dynamic_sampling=true", "train.steps=2",
                    'reward.verifiers=[{name="format", args={pattern="zzz"}}]')
    with pytest.raises(RuntimeError, match="groups in a row were dropped"):
        train(cfg, progress=False)


def test_a_run_saved_before_a_config_key_existed_resumes(tmp_path):
    # a run directory written by an older reroll lacks keys added since (here all of
    # [control]): they read as their defaults, not as a changed config
    import tomli_w

    from reroll.config import read_toml

    out = tmp_path / "run"
    train(small_cfg(out, "train.steps=1"), progress=False)
    saved = read_toml(out / "config.toml")
    del saved["control"]
    (out / "config.toml").write_text(tomli_w.dumps(saved))
    train(small_cfg(out, "train.steps=2"), resume=True, progress=False)
    assert [m["step"] for m in read_metrics(out)] == [1, 2]
