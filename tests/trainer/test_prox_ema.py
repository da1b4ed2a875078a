"""PPO-EWMA's proximal weights: the average by hand, the trainer's pi_prox from it, and a
stopped-and-resumed run equal to an uninterrupted one bitwise (policy and average)."""

import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.runtime import train
from reroll.trainer.options import TrainerOptions
from reroll.trainer.prox_ema import EMA_FILE, ProxEma
from reroll.trainer.step import Trainer

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_step import groups_of  # noqa: E402  (the same tiny groups as the step's tests)


def test_the_average_moves_by_one_minus_decay_of_the_gap_each_update():
    lin = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        lin.weight.fill_(2.0)
    ema = ProxEma(lin, decay=0.75)
    with torch.no_grad():
        lin.weight.fill_(4.0)
    ema.update(lin)  # 0.75 x 2 + 0.25 x 4 = 2.5
    assert ema.model.weight.item() == 2.5
    with torch.no_grad():
        lin.weight.fill_(0.0)
    ema.update(lin)  # 0.75 x 2.5 + 0.25 x 0 = 1.875
    assert ema.model.weight.item() == 1.875 and ema.updates == 2
    assert not ema.model.weight.requires_grad
    back = ProxEma(lin, decay=0.75)
    back.load(ema.state())
    assert back.model.weight.item() == 1.875 and back.updates == 2
    with pytest.raises(ValueError, match="decay 0.75, this run asks 0.5"):
        ProxEma(lin, decay=0.5).load(ema.state())


def test_the_trainer_takes_pi_prox_from_the_average(tiny):
    """Step 1: the average is the starting weights, which are also the current ones (ppo_kl
    0). Step 2: it lags the weights (0.9 x w0 + 0.1 x w1), so pi_theta / pi_prox differs
    from 1 at the first pass, where without it (one mini-batch) ppo_kl is exactly 0."""
    model, tok = tiny
    w0 = {k: v.clone() for k, v in model.state_dict().items()}
    t = Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=1e-2, prox_ema=0.9), tokenizer=tok)
    m1 = t.step(groups_of([[1.0, 0.0], [0.0, 1.0]]))
    assert m1["ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    w1 = model.state_dict()
    avg = t.prox_ema.model.state_dict()
    for k, v in w0.items():
        if v.is_floating_point():
            assert torch.allclose(avg[k], 0.9 * v + 0.1 * w1[k], atol=1e-7), k
    m2 = t.step(groups_of([[1.0, 0.0], [0.0, 1.0]]))
    assert abs(m2["ppo_kl"]) > 1e-7


def test_a_resumed_run_with_the_average_equals_the_uninterrupted_one_bitwise(tmp_path,
                                                                              small_run):
    a, b = tmp_path / "a", tmp_path / "b"
    ema = ["train.prox_ema=0.9", "ckpt_every=2"]
    train(small_run(a, "train.steps=4", *ema), progress=False)
    train(small_run(b, "train.steps=2", *ema), progress=False)
    train(small_run(b, "train.steps=4", *ema), resume=True, progress=False)
    ck = [tmp_path / x / "checkpoints" / "step_000004" for x in "ab"]
    wa, wb = (load_file(str(c / "model" / "model.safetensors")) for c in ck)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    ea, eb = (torch.load(c / EMA_FILE, map_location="cpu") for c in ck)
    assert ea["updates"] == eb["updates"] == 4
    assert all(torch.equal(ea["weights"][k], eb["weights"][k]) for k in ea["weights"])
    assert any(not torch.equal(ea["weights"][k], wa[k]) for k in wa)  # it does lag
