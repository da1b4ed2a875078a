"""The SFT warm start: its learning-rate schedule (values by hand) and that it learns."""

import pytest

from reroll.trainer.sft import lr_factor


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


def test_sft_loss_falls_on_demonstrations(tiny):
    from reroll import build
    from reroll.config import load_config
    from reroll.trainer.sft import sft

    model, tok = tiny
    cfg = load_config(None, ["task.args.digits=1", "task.args.n_train=64", "task.args.n_test=8"])
    task = build.build_task(cfg)
    losses = sft(model, tok, task.train, build.encode_prompt(tok), steps=30, lr=3e-3,
                 batch_size=32, warmup_steps=5)
    # a random-init char model starts near log(vocab); 30 steps on 1-digit sums must cut it
    assert losses[-1] < 0.6 * losses[0]


def test_a_multi_turn_demo_has_loss_on_policy_turns_and_eos_only(tiny):
    from reroll import build
    from reroll.rollout import Example
    from reroll.trainer.sft import demo_rollout

    _, tok = tiny
    ex = Example("m", "12*3=", "36")
    turns = [("policy", "<calc>12*3</calc>"), ("env", "<res>36</res>"), ("policy", "36")]
    r = demo_rollout(ex, build.encode_prompt(tok), tok.eos_token_id, tok, turns,
                     build.encode_observation(tok))
    P = 1 + 5  # BOS + "12*3="
    assert r.prompt_len == P
    # 17 policy characters, 13 env characters, 2 policy characters, EOS
    assert r.loss_mask == [False] * P + [True] * 17 + [False] * 13 + [True] * 2 + [True]
    assert tok.decode(r.tokens, skip_special_tokens=True) == \
        "12*3=<calc>12*3</calc><res>36</res>36"
    assert r.tokens[-1] == tok.eos_token_id
