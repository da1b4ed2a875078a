"""Training at real sizes, on the test device (``--device``, the CPU unless asked): bf16
autocast keeps float32 master weights and AdamW state and publishes bf16 weights; a bf16 run
trains end to end; activation checkpointing changes no gradient; the trainer reports the policy's entropy; `model.device` places the
trainer and the engine, and a GPU asked for where there is none is refused naming the key."""

import math

import pytest
import torch

from reroll import build
from reroll.algo import build_objective
from reroll.config import AlgoConfig, ConfigError
from reroll.config_checks import load_checked
from reroll.rollout import Example, SamplingParams, Score, new_group
from reroll.trainer.batch import collate
from reroll.trainer.options import TrainerOptions
from reroll.trainer.step import Trainer


def groups_of(rewards_per_group, tokens=(7, 8, 9)):
    out = []
    for i, rewards in enumerate(rewards_per_group):
        g = new_group(Example(f"p{i}", "1+1=", "2"), len(rewards), [2, 5, 6 + i],
                      SamplingParams(), 0)
        for j, (r, rew) in enumerate(zip(g.rollouts, rewards)):
            for t in tokens[: 2 + j % 2]:
                r.append(t, -4.0, 0)
            r.finish, r.scores, r.reward = "stop", [Score("exact", value=rew)], rew
        out.append(g)
    return out


GROUPS = [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]


def test_bf16_trainer_keeps_fp32_weights_and_adam_state_and_publishes_bf16(tiny, device):
    model, _ = tiny
    model.to(device)
    fp32 = Trainer(model, build_objective(AlgoConfig()), TrainerOptions(pad_id=0, lr=1e-3))
    batch = collate([r for g in groups_of(GROUPS) for r in g.rollouts], pad_id=0).to(device)
    with torch.no_grad():
        want = fp32._forward(model, batch)[0]  # [N, T]
    t = Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=1e-3, autocast_dtype=torch.bfloat16))
    with torch.no_grad():
        got = t._forward(model, batch)[0]
    # bf16 keeps 8 bits of mantissa (relative error ~2^-9 per rounding); the log-probs, near
    # -5 here, move by thousandths (measured: 0.003 at most)
    m = batch.mask.bool()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[m], want[m], rtol=0, atol=0.02)
    assert not torch.equal(got, want)  # autocast really ran the matmuls in bf16
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = t.step(groups_of(GROUPS))
    assert math.isfinite(metrics["loss/policy"]) and metrics["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in model.parameters())
    for p in model.parameters():
        state = t.opt.state[p]
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    published = t.weights()
    assert {v.dtype for v in published.values()} == {torch.bfloat16}
    k = next(iter(published))
    assert torch.equal(published[k], model.state_dict()[k].to(torch.bfloat16))


def test_a_bf16_run_with_activation_checkpointing_trains(tmp_path, device):
    from safetensors.torch import load_file

    from reroll.runlog import read_metrics
    from reroll.runtime import train

    out = tmp_path / "bf16"
    cfg = load_checked(None, [
        f"out_dir={out}", "model.dtype=bfloat16", f"model.device={device}", "train.steps=2",
        "train.gradient_checkpointing=true",
        "model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
        "task.args.n_test=10", "rollout.group_size=4", "rollout.batch_groups=2",
        "rollout.max_new_tokens=4", "reward.workers=0", "log_every=1", "ckpt_every=2",
        "train.lr=1e-3", "runtime.threads=1",
        'reward.verifiers=[{name="format", args={pattern="[0-9]", fullmatch=false}}]'])
    train(cfg, progress=False)
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(math.isfinite(r["loss/policy"]) and r["grad_norm"] > 0 for r in rows)
    assert all(0 < r["train/entropy"] <= math.log(100) for r in rows)
    w0 = load_file(str(out / "init" / "model.safetensors"))
    w = load_file(str(out / "checkpoints" / "step_000002" / "model" / "model.safetensors"))
    assert {v.dtype for v in w.values()} == {torch.float32}  # the master weights are saved
    assert any(not torch.equal(w0[k], w[k]) for k in w)


def test_the_engine_gets_the_model_dtype_on_the_trainers_device(tiny_dir, device):
    cfg = load_checked(None, ["model.dtype=bfloat16", f"model.device={device}"])
    trainer = build.build_trainer(cfg, tiny_dir)
    want = torch.empty(0, device=device).device  # "cuda" as tensors report it: cuda:0
    assert trainer.device == want
    assert {p.dtype for p in trainer.model.parameters()} == {torch.float32}
    engine = build.build_engine(trainer.policy(), build.load_tokenizer(tiny_dir), cfg)
    assert engine.dtype == torch.bfloat16 and engine.device == want
    engine.update_weights(trainer.weights(), 1)  # bf16 weights load into the bf16 engine


def test_engine_device_places_the_runs_engine_apart_from_the_trainer(tiny_dir, device):
    """engine.device puts the training run's engine on a device of its own (here the CPU,
    with the trainer on --device); published weights cross over exactly, and the engine
    then generates what the trainer's own model, on the CPU, greedily would."""
    cfg = load_checked(None, [f"model.device={device}", "engine.device=cpu",
                              "train.lr=1e-2"])
    trainer = build.build_trainer(cfg, tiny_dir)
    tok = build.load_tokenizer(tiny_dir)
    core = build.run_engine(trainer, tok, cfg)
    assert trainer.device == torch.empty(0, device=device).device
    assert core.device == torch.device("cpu")
    assert {p.device for p in core.model.parameters()} == {torch.device("cpu")}
    trainer.step(groups_of(GROUPS))  # the trainer's weights move, on its device
    core.update_weights(trainer.weights(), trainer.version)
    engine_w = core.model.state_dict()
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(engine_w[k], v.cpu()), k
    sp = SamplingParams(temperature=0.0, max_new_tokens=5, stop_token_ids=[])
    (r,) = core.generate([new_group(Example("p", "", ""), 1, [2, 5, 6], sp, 0).rollouts[0]])
    ids = torch.tensor([[2, 5, 6]])
    ref = trainer.model.cpu().generate(ids, attention_mask=torch.ones_like(ids),
                                       max_new_tokens=5, do_sample=False, min_new_tokens=5)
    assert r.tokens[3:] == ref[0, 3:].tolist()
    assert core.version == trainer.version == 1
    # without engine.device, the engine follows model.device
    same = load_checked(None, [f"model.device={device}"])
    plain = build.run_engine(build.build_trainer(same, tiny_dir), tok, same)
    assert plain.device == torch.empty(0, device=device).device


def test_in_loop_evaluation_generates_on_the_engines_device(tmp_path, small_run, monkeypatch):
    """A run's held-out evaluation builds its engine where engine.device says, as the run's
    own engine, not on the trainer's device (model.device, here --device): each engine the
    run builds, the training one and the evaluations' (steps 0, 1, 2), is on the CPU."""
    from reroll.runtime import train

    built, asked = [], []
    real = build.build_engine

    def spy(*args, **kwargs):
        asked.append(kwargs.get("device"))  # None would mean "the policy's own device"
        core = real(*args, **kwargs)
        built.append(core.device)
        return core

    monkeypatch.setattr(build, "build_engine", spy)
    cfg = small_run(tmp_path / "run", "engine.device=cpu", "train.steps=2", "eval.every=1",
                    "eval.n_examples=4", "eval.k=1")
    train(cfg, progress=False)
    assert built == [torch.device("cpu")] * 4  # the run's engine, then 3 evaluations
    assert asked == ["cpu"] * 4  # each one placed by engine.device, not left to the policy's


def test_gradient_checkpointing_gives_the_same_gradients(tiny_dir, device):
    batch = collate([r for g in groups_of(GROUPS) for r in g.rollouts], pad_id=0).to(device)

    def grads(on: bool):
        cfg = load_checked(None, [f"train.gradient_checkpointing={str(on).lower()}",
                                  f"model.device={device}"])
        t = build.build_trainer(cfg, tiny_dir)
        t.model.eval()  # as Trainer.step runs it
        calls = []  # a checkpointed layer's attention runs again in the backward pass
        t.model.model.layers[0].self_attn.register_forward_hook(lambda *a: calls.append(1))
        logp, _ = t._forward(t.model, batch)
        (logp * batch.mask).sum().backward()
        assert t.model.config.use_cache is not on
        return {k: p.grad for k, p in t.model.named_parameters()}, len(calls)

    plain, n_plain = grads(False)
    ckpt, n_ckpt = grads(True)
    assert (n_plain, n_ckpt) == (1, 2)
    for k in plain:
        torch.testing.assert_close(ckpt[k], plain[k], rtol=0, atol=1e-6, msg=k)


def test_gradient_checkpointing_is_refused_for_a_model_with_dropout(tiny, tmp_path, device):
    model, tok = tiny
    model.config.attention_dropout = 0.1  # a checkpointed layer might apply it itself
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    on = f"model.device={device}"
    cfg = load_checked(None, ["train.gradient_checkpointing=true", on])
    with pytest.raises(ConfigError, match=r"without dropout .*'attention_dropout': 0.1"):
        build.build_trainer(cfg, tmp_path)
    build.build_trainer(load_checked(None, [on]), tmp_path)  # without checkpointing: eval mode


def test_the_trainer_reports_the_mean_entropy_of_trained_tokens(tiny, device):
    model, _ = tiny
    model.to(device)
    groups = groups_of(GROUPS)
    batch = collate([r for g in groups for r in g.rollouts], pad_id=0).to(device)
    t = Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=0.0, micro_batch=2))
    with torch.no_grad():
        _, ent = t._forward(model, batch, entropy=True)  # [N, T]
    want = float((ent * batch.mask).sum() / batch.mask.sum())
    assert t.step(groups)["train/entropy"] == pytest.approx(want, rel=1e-6)


def test_model_device_cpu_is_accepted_and_a_missing_gpu_is_refused():
    assert load_checked(None, ["model.device=cpu"]).model.device == "cpu"
    with pytest.raises(ConfigError, match=r"model.device must be auto, cpu, cuda or cuda:N"):
        load_checked(None, ["model.device=gpu"])
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"model.device = 'cuda' but torch sees no CUDA"):
            load_checked(None, ["model.device=cuda"])


def test_the_engines_copy_is_made_tensor_by_tensor_tied_and_without_gradients(tiny_dir, device):
    """`build.module_copy`: the engine's model equals the trainer's at the engine's dtype and
    device, keeps tied embeddings tied, takes no gradients along, and shares no storage."""
    cfg = load_checked(None, ["model.dtype=bfloat16", f"model.device={device}"])
    trainer = build.build_trainer(cfg, tiny_dir)
    src = trainer.model
    for p in src.parameters():
        p.grad = torch.ones_like(p)  # as after an update: not the engine's to copy
    out = build.module_copy(src, "cpu", torch.bfloat16)
    assert src.config.tie_word_embeddings
    assert out.get_output_embeddings().weight is out.get_input_embeddings().weight
    want = {k: v.detach().to("cpu", torch.bfloat16 if v.is_floating_point() else None)
            for k, v in src.state_dict().items()}
    got = out.state_dict()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]) and got[k].dtype == want[k].dtype, k
    bufs = dict(out.named_buffers())
    for k, b in src.named_buffers():  # non-persistent ones too (rotary frequencies)
        assert bufs[k].device.type == "cpu"
        assert torch.equal(bufs[k].float(), b.detach().cpu().to(bufs[k].dtype).float()), k
    assert all(p.grad is None for p in out.parameters())
    assert {p.dtype for p in src.parameters()} == {torch.float32}  # the trainer's untouched
    p = next(out.parameters())
    with torch.no_grad():
        p.add_(1)
    assert not torch.equal(p.float().cpu(), next(src.parameters()).detach().float().cpu())
