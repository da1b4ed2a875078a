"""The SFT warm start: its learning-rate schedule (values by hand) and that it learns."""

import pytest
from float_bounds import assert_reordered_close

from reroll.trainer.schedules import lr_factor


def test_constant_schedule_warms_up_then_holds():
    # warm-up 4: steps 0..3 get 1/4, 2/4, 3/4, 4/4; afterwards 1 whatever the total
    got = [lr_factor(s, steps=10, warmup_steps=4, schedule="constant") for s in range(6)]
    assert got == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert lr_factor(999, steps=10, warmup_steps=4, schedule="constant") == 1.0


def test_linear_schedule_decays_to_zero_at_steps():
    # steps 10, warm-up 4: step 1 -> 2/4 * (1 - 1/10) = 0.45; step 5 -> 1 * (1 - 5/10) = 0.5;
    # step 10 -> 0; past the end stays 0
    f = [lr_factor(s, steps=10, warmup_steps=4, schedule="linear") for s in (1, 5, 10, 12)]
    assert f == pytest.approx([0.45, 0.5, 0.0, 0.0])


def test_no_warmup_and_unknown_schedule():
    assert lr_factor(0, steps=10, warmup_steps=0, schedule="constant") == 1.0
    with pytest.raises(ValueError, match="sft.schedule must be one of"):
        lr_factor(0, steps=10, warmup_steps=0, schedule="cosine")


def test_sft_loss_falls_on_demonstrations(tiny, device):
    from reroll import build, build_rollout
    from reroll.config_checks import load_checked
    from reroll.trainer.sft import sft

    model, tok = tiny
    model.to(device)
    cfg = load_checked(None, ["task.args.digits=1", "task.args.n_train=64", "task.args.n_test=8"])
    task = build.build_task(cfg)
    losses = sft(model, tok, task.train, build_rollout.encode_prompt(tok), steps=30, lr=3e-3,
                 batch_size=32, warmup_steps=5)
    # a random-init char model starts near log(vocab); 30 steps on 1-digit sums must cut it
    assert losses[-1] < 0.6 * losses[0]


def test_a_multi_turn_demo_has_loss_on_policy_turns_and_eos_only(tiny):
    from reroll import build_rollout
    from reroll.rollout import Example
    from reroll.trainer.sft import demo_rollout

    _, tok = tiny
    ex = Example("m", "12*3=", "36")
    turns = [("policy", "<calc>12*3</calc>"), ("env", "<res>36</res>"), ("policy", "36")]
    r = demo_rollout(ex, build_rollout.encode_prompt(tok), tok.eos_token_id, tok, turns,
                     build_rollout.encode_observation(tok))
    P = 1 + 5  # BOS + "12*3="
    assert r.prompt_len == P
    # 17 policy characters, 13 env characters, 2 policy characters, EOS
    assert r.loss_mask == [False] * P + [True] * 17 + [False] * 13 + [True] * 2 + [True]
    assert tok.decode(r.tokens, skip_special_tokens=True) == \
        "12*3=<calc>12*3</calc><res>36</res>36"
    assert r.tokens[-1] == tok.eos_token_id


def test_bf16_sft_keeps_fp32_weights_and_adam_state_and_its_loss_falls(tiny, monkeypatch,
                                                                       device):
    import torch

    from reroll import build, build_rollout
    from reroll.config_checks import load_checked
    from reroll.trainer.sft import sft

    made = []

    class AdamW(torch.optim.AdamW):  # the optimiser sft builds, kept for its state
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(torch.optim, "AdamW", AdamW)
    model, tok = tiny
    model.to(device)
    cfg = load_checked(None, ["task.args.digits=1", "task.args.n_train=64", "task.args.n_test=8"])
    task = build.build_task(cfg)
    kw = dict(steps=12, lr=3e-3, batch_size=32, warmup_steps=2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    fp32 = sft(model, tok, task.train, build_rollout.encode_prompt(tok), **kw)
    model.load_state_dict(start)
    bf16 = sft(model, tok, task.train, build_rollout.encode_prompt(tok), autocast_dtype=torch.bfloat16,
               **kw)
    # the weights and both AdamW moments stay float32 (the master copy) under bf16 autocast
    assert all(p.dtype == torch.float32 for p in model.parameters())
    state = made[-1].state
    assert len(state) == len(list(model.parameters()))
    for s in state.values():
        assert s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32
    # autocast really ran (bf16 matmuls move the loss) but it tracks the float32 run, and falls
    assert bf16[0] != fp32[0]
    assert bf16[0] == pytest.approx(fp32[0], abs=0.02)
    assert bf16[-1] < 0.8 * bf16[0]


def test_reroll_sft_bf16_on_an_explicit_cpu_device_saves_in_model_dtype(tmp_path):
    import json

    import torch
    from safetensors.torch import load_file

    from reroll.cli import main
    from reroll.models import load
    from reroll.runlog import read_metrics

    out = tmp_path / "sft"
    # on the CPU whatever --device says: an explicit model.device=cpu is what this test checks
    assert main(["sft", "-", f"out_dir={out}", "model.device=cpu", "model.dtype=bfloat16",
                 "model.max_position=32", "task.args.digits=1", "task.args.n_train=40",
                 "task.args.n_test=8", "sft.steps=20", "sft.batch_size=16",
                 "sft.warmup_steps=0", "sft.lr=3e-3", "runtime.threads=1"]) == 0
    # saved as today: weights and config in model.dtype, loadable through the Auto classes
    model_dir = out / "model"
    assert json.loads((model_dir / "config.json").read_text())["dtype"] == "bfloat16"
    assert {v.dtype for v in load_file(model_dir / "model.safetensors").values()} == {
        torch.bfloat16}
    model, _ = load(model_dir, "bfloat16")
    assert next(model.parameters()).device.type == "cpu"
    losses = [m["sft/loss"] for m in read_metrics(out) if "sft/loss" in m]
    assert len(losses) == 2 and losses[1] < losses[0]  # logged at steps 10 and 20


def test_micro_batches_give_the_one_pass_loss_and_gradients(tiny):
    """`sft.micro_batch_tokens`: the batch forwarded in micro-batches of at most 48 padded
    positions (longest demos together) accumulates the same loss and gradients as one padded
    pass, up to the order of the sums: the loss is a sum over the batch's demo tokens
    divided by their count either way. Each gradient entry is a sum over the batch's
    positions (at most 8 x 24 terms) of products built by a chain of reductions through the
    model (embedding, 2 blocks, head: depth 8, generous), so `float_bounds`' reorder bound."""
    import torch

    from reroll import build_rollout
    from reroll.rollout import Example
    from reroll.trainer.sft import _accumulate, demo_rollout

    model, tok = tiny
    model.float()
    encode = build_rollout.encode_prompt(tok)
    demos = ["7", "1234567", "12", "99999999999", "3", "456", "8888888888888888", "10"]
    rows = [demo_rollout(Example(f"p{i}", f"{i}+{i}=", d, demo=d), encode, tok.eos_token_id, tok)
            for i, d in enumerate(demos)]
    widths = [len(r.tokens) for r in rows]
    assert max(widths) <= 24 and min(widths) < max(widths) / 2  # lengths that vary

    def run(micro_tokens):
        model.zero_grad(set_to_none=True)
        loss = _accumulate(model, rows, tok.pad_token_id, "cpu", micro_tokens, None, 0)
        return loss, [p.grad.clone() for p in model.parameters()]

    loss_one, grads_one = run(0)
    loss_micro, grads_micro = run(48)
    n_terms = len(rows) * max(widths)
    assert abs(loss_micro - loss_one) <= 8 * n_terms * torch.finfo(torch.float32).eps * loss_one
    scale = max(float(g.abs().max()) for g in grads_one)
    for i, (a, b) in enumerate(zip(grads_one, grads_micro, strict=True)):
        assert_reordered_close(b, a, n_terms, depth=8, msg=f"parameter {i}", scale=scale)
    # and the micro-batched path really split the batch: a 48-position budget cannot hold
    # 8 rows of up to 24 positions in one pass
    from reroll.trainer.micro_batches import plan_micro_batches
    assert len(plan_micro_batches(widths, len(rows), 48)) > 1
