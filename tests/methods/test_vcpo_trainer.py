"""VCPO in the trainer: per-sample gradient norms equal separate single-sample backward
passes and reach the OPOB estimator; on-policy the ESS factor is exactly 1 and the update is
the plain one bitwise; off-policy the mini-batch steps at lr x factor and the schedule's lr
comes back; an asynchronous run with both options on logs the metrics."""

import math

import pytest
import torch
from float_bounds import assert_reordered_close

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.methods import vcpo
from reroll.rollout import Example, SamplingParams, Score, new_group
from reroll.runlog import read_metrics
from reroll.runtime import train
from reroll.trainer.batch import collate, flatten, token_logprobs
from reroll.trainer.options import TrainerOptions
from reroll.trainer.step import Trainer

# responses of different lengths, so cutting each sample to its own length matters
RESPONSES = [[[7, 8], [9], [7, 8, 9]], [[8, 8, 8], [10, 7]]]
REWARDS = [[1.0, 0.0, 0.0], [1.0, 0.0]]


def make_groups():
    out = []
    for i, (responses, rewards) in enumerate(zip(RESPONSES, REWARDS)):
        g = new_group(Example(f"p{i}", "1+1=", "2"), len(responses), [2, 5, 6],
                      SamplingParams(), 0)
        for r, toks, rew in zip(g.rollouts, responses, rewards):
            for t in toks:
                r.append(t, -2.0, 0)
            r.finish, r.scores, r.reward = "stop", [Score("exact", value=rew)], rew
        out.append(g)
    return out


def set_behaviour(groups, model, shift=None):
    """Behaviour log-probs = the model's own (on-policy, w_i = 1 exactly), or minus
    ``shift[i]`` on sample i's first response token (log w_i = shift[i])."""
    rollouts = flatten(groups)[0]
    batch = collate(rollouts, pad_id=0).to(next(model.parameters()).device)
    with torch.no_grad():
        lp = token_logprobs(model, batch)  # [N, T]
    for i, r in enumerate(rollouts):
        own = [0.0] + lp[i, :len(r.tokens) - 1].tolist()
        if shift is not None:
            own[r.prompt_len] -= shift[i]
        r.logprobs = own
    return groups


def params_of(model):
    return [p for p in model.parameters() if p.requires_grad]


def test_per_sample_gradient_norms_equal_separate_single_sample_backward_passes(tiny, device):
    model, _ = tiny
    model.to(device)
    rollouts = flatten(make_groups())[0]
    t = Trainer(model, build_objective(AlgoConfig(advantage="opob")),
                TrainerOptions(pad_id=0, lr=1e-3))
    batch = collate(rollouts, pad_id=0).to(device)
    model.zero_grad(set_to_none=True)
    sq, logp = vcpo.score_grad_sq_norms(lambda b: t._forward(model, b)[0], params_of(model),
                                        batch)
    assert all(p.grad is None for p in params_of(model))  # .grad untouched
    for i, r in enumerate(rollouts):  # each sample alone, backward into .grad
        model.zero_grad(set_to_none=True)
        alone = collate([r], pad_id=0).to(device)
        lp = token_logprobs(model, alone)
        (lp * alone.mask).sum().backward()
        expect = sum(float(p.grad.double().pow(2).sum()) for p in params_of(model)
                     if p.grad is not None)
        assert expect > 0 and sq[i].item() == pytest.approx(expect, rel=1e-6)
        n = alone.mask.shape[1]
        # alone vs in the batch: other matmul shapes, sums in another order; the tiny
        # model's longest sums are its MLP's (intermediate_size = 256 terms)
        assert_reordered_close(lp.detach()[0], logp[i, :n], 256)
    # a sample kept out of the loss has no score gradient: norm 0, and no pass is made
    rollouts[1].loss_exclusion = "pruned"
    calls = []
    sq2, _ = vcpo.score_grad_sq_norms(lambda b: calls.append(1) or token_logprobs(model, b),
                                      params_of(model), collate(rollouts, pad_id=0).to(device))
    assert sq2[1] == 0.0 and len(calls) == len(rollouts) - 1
    assert torch.allclose(sq2[[0, 2, 3, 4]], sq[[0, 2, 3, 4]], rtol=1e-6)


def test_the_trainer_feeds_opob_the_norms_and_weights_of_each_sample(tiny, device):
    model, _ = tiny
    model.to(device)
    groups = set_behaviour(make_groups(), model, shift=[0.5, 0.0, -0.25, 1.0, 0.0])
    rollouts = flatten(groups)[0]
    batch = collate(rollouts, pad_id=0).to(device)
    sq, _ = vcpo.score_grad_sq_norms(lambda b: token_logprobs(model, b), params_of(model), batch)
    t = Trainer(model, build_objective(AlgoConfig(advantage="opob")),
                TrainerOptions(pad_id=0, lr=0.0, minibatches=2))
    seen = {}
    real = t.objective.advantage_fn

    def spy(rewards, components, group_index, token_counts=None, seq_log_weights=None,
            grad_sq_norms=None, minibatch_index=None):
        seen.update(w=seq_log_weights, sq=grad_sq_norms, mb=minibatch_index, n=token_counts)
        return real(rewards, components, group_index, token_counts=token_counts,
                    seq_log_weights=seq_log_weights, grad_sq_norms=grad_sq_norms,
                    minibatch_index=minibatch_index)

    t.objective.advantage_fn = spy
    m = t.step(groups)
    assert torch.allclose(seen["sq"], sq, rtol=1e-6)
    # log w_i = the shift put on each sample's first token; 5 samples in 2 mini-batches of 3
    assert torch.allclose(seen["w"], torch.tensor([0.5, 0.0, -0.25, 1.0, 0.0],
                                                  dtype=torch.float64), atol=1e-5)
    assert seen["mb"].tolist() == [0, 0, 0, 1, 1]
    assert seen["n"].tolist() == [2.0, 1.0, 3.0, 3.0, 2.0]
    assert m["vcpo/sample_grad_norm_mean"] == pytest.approx(float(sq.sqrt().mean()), rel=1e-6)


@pytest.mark.parametrize("minibatches", [1, 2])
def test_on_policy_the_ess_factor_is_exactly_one_and_the_update_is_the_plain_one(tiny,
                                                                                 minibatches,
                                                                                 device):
    model, _ = tiny
    model.to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def run(**algo):
        model.load_state_dict(state)
        groups = set_behaviour(make_groups(), model)
        t = Trainer(model, build_objective(AlgoConfig(**algo)),
                    TrainerOptions(pad_id=0, lr=1e-2, minibatches=minibatches))
        m = t.step(groups)
        return {k: v.clone() for k, v in model.state_dict().items()}, m

    plain, _ = run()
    scaled, m = run(ess_lr=True)
    assert m["vcpo/ess_ratio"] == 1.0 and m["vcpo/lr_scale"] == 1.0
    assert m["vcpo/ess"] == 5.0 / minibatches  # mean over mini-batches: 5, or (3 + 2) / 2
    assert all(torch.equal(plain[k], scaled[k]) for k in plain)
    assert not all(torch.equal(plain[k], state[k]) for k in plain)  # it did update


def test_off_policy_a_minibatch_steps_at_the_scaled_lr_and_the_schedule_is_kept(tiny, device):
    model, _ = tiny
    model.to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    # log w = [0, log 2, log 3, log 2, 0] -> w = [1, 2, 3, 2, 1]: (sum w)^2 / sum w^2 =
    # 81 / 19 = 4.2632, rho = 4.2632 / 5 = 0.85263, sqrt rule: 0.92338
    shift = [0.0, math.log(2), math.log(3), math.log(2), 0.0]

    def run(lr, **algo):
        model.load_state_dict(state)
        groups = set_behaviour(make_groups(), model, shift=shift)
        t = Trainer(model, build_objective(AlgoConfig(**algo)), TrainerOptions(pad_id=0, lr=lr))
        m = t.step(groups)
        return {k: v.clone() for k, v in model.state_dict().items()}, m, t

    scaled, m, t = run(1e-2, ess_lr=True)
    assert m["vcpo/ess_ratio"] == pytest.approx(0.85263, abs=1e-4)
    assert m["vcpo/lr_scale"] == pytest.approx(0.92338, abs=1e-4)
    assert m["vcpo/ess_ratio_min"] == m["vcpo/ess_ratio"]
    assert t.opt.param_groups[0]["lr"] == 1e-2 and m["lr"] == 1e-2  # put back
    # the same update as a plain trainer run at lr x factor
    plain, _, _ = run(1e-2 * m["vcpo/lr_scale"])
    assert all(torch.equal(plain[k], scaled[k]) for k in plain)


def test_an_async_run_with_vcpo_on_completes_and_logs_its_metrics(tmp_path, small_run):
    cfg = small_run(tmp_path, "train.steps=4", "runtime.max_staleness=2", "algo.ess_lr=true",
                    "algo.advantage=opob")
    train(cfg, progress=False)
    rows = read_metrics(tmp_path)
    assert [m["step"] for m in rows] == [1, 2, 3, 4]
    for m in rows:
        assert 0 < m["vcpo/ess_ratio"] <= 1 and 0 < m["vcpo/lr_scale"] <= 1
        assert m["vcpo/lr_scale"] == pytest.approx(math.sqrt(m["vcpo/ess_ratio"]))
        assert m["vcpo/sample_grad_norm_mean"] > 0 and math.isfinite(m["loss/policy"])
    assert max(m["staleness/max_lag"] for m in rows) >= 1  # it did train on stale tokens
