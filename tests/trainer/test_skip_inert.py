"""Samples that cannot move the weights are left out of the loss's passes
(`train.skip_zero_advantage`): the update equals the full pass's (gradients within the
rounding bound of sums taken in another order, `tests/float_bounds.py`: the matmuls see fewer
rows), only the samples with signal are forwarded,
and objectives where A = 0 is not inert (a KL term in the loss, VCPO's ESS-scaled lr) pass
every sample."""

import copy

import pytest
import torch
from float_bounds import assert_steps_close

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.rollout import Example, SamplingParams, Score, new_group
from reroll.trainer.batch import collate
from reroll.trainer.options import TrainerOptions
from reroll.trainer.step import Trainer

# group rewards: two mixed groups (5 samples with signal), two uniform ones (6 without)
MIXED = [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0]]
LIVE = 5


def groups_of(rewards_per_group):
    out = []
    for i, rewards in enumerate(rewards_per_group):
        g = new_group(Example(f"p{i}", "1+1=", "2"), len(rewards), [2, 5, 6 + i],
                      SamplingParams(), 0)
        for j, (r, rew) in enumerate(zip(g.rollouts, rewards)):
            for k, t in enumerate((7, 8, 9)[: 2 + j % 2]):
                r.append(t, -3.0 - 0.3 * k - 0.1 * j, 0)  # behaviour log-probs off-policy
            r.finish, r.scores, r.reward = "stop", [Score("exact", value=rew)], rew
        out.append(g)
    return out


def run(model, start, algo, batches, skip, weights=None, **kw):
    """The gradient at every optimiser step, the final policy's log-probs on a fixed batch,
    the step metrics and the samples forwarded, after stepping ``batches``."""
    model.load_state_dict(start)
    ref = copy.deepcopy(model) if algo.kl_coef > 0 else None
    t = Trainer(model, build_objective(algo),
                TrainerOptions(pad_id=0, lr=1e-2, skip_inert=skip, **kw), ref_model=ref)
    # AdamW's eps above any gradient of pure rounding noise (at most n_terms * eps32 * the
    # largest gradient, ~3e-6 here): at its default 1e-8 such a gradient's sign, which the
    # summation order decides, moves its weight by a full lr, and the next step's gradients
    # then differ by more than rounding (seen on an Intel Xeon: 1.0e-5 against a 3.5e-6
    # bound). At 1e-4 a noise gradient moves its weight by at most lr |g| / eps, to first order.
    for group in t.opt.param_groups:
        group["eps"] = 1e-4
    rows, grads, real_fwd = [], [], t._forward
    t._forward = lambda m, b, entropy=False, **kw: (  # the loss's passes (with autograd)
        rows.append(len(b)) if torch.is_grad_enabled() else None) or real_fwd(m, b, entropy, **kw)
    t.opt.register_step_pre_hook(lambda *_: grads.append(
        [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    metrics = []
    for b in batches:
        groups = groups_of(b)
        for r, w in zip([r for g in groups for r in g.rollouts], weights or []):
            r.sample_weight = w
        metrics.append(t.step(groups))
    passed = rows
    probe = collate([r for g in groups_of(MIXED) for r in g.rollouts], pad_id=0).to(t.device)
    with torch.no_grad():
        logp = t._forward(model, probe)[0] * probe.mask
    return grads, logp, metrics, passed


def assert_same_update(a, b, n_terms=256):
    """Equal gradients at every optimiser step, and so the same final policy. (The weights
    themselves are not compared: a parameter with no effect on the output, such as a key
    bias, has a gradient of pure rounding noise that AdamW scales up to lr-sized steps.)

    Leaving samples out changes the rows of every matmul, so a CPU's BLAS may block and order
    their sums differently (not bitwise on every x86 CPU): each step's gradients agree within
    the bound for sums of ``n_terms`` terms in another order (`float_bounds`). The longest
    reductions of the tiny model's passes are its MLP's inner products (intermediate_size =
    256 terms); a weight's gradient sums at most 11 samples x 6 positions = 66 positions, and
    the output head's backward 99 vocabulary entries."""
    assert_steps_close(a[0], b[0], n_terms)
    torch.testing.assert_close(a[1], b[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algo, kw", [
    (AlgoConfig(), {}),
    (AlgoConfig(correction="mis_seq", correction_args={"upper": 50.0}), {"micro_batch": 2}),
    (AlgoConfig(aggregation="seq_mean_token_mean", surrogate="gspo"), {"minibatches": 2}),
    (AlgoConfig(surrogate="reinforce", surrogate_args={"ratio": True}),
     {"minibatches": 2, "micro_batch": 3}),
    (AlgoConfig(kl_coef=0.05, kl_in_reward=True), {}),
])
def test_skipping_zero_advantage_samples_gives_the_full_passes_update(tiny, algo, kw, device):
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    batches = [MIXED, [[0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], MIXED]
    full = run(model, start, algo, batches, skip=False, **kw)
    skip = run(model, start, algo, batches, skip=True, **kw)
    assert_same_update(full, skip)
    model.load_state_dict(start)  # the steps moved the policy
    probe = collate([r for g in groups_of(MIXED) for r in g.rollouts], pad_id=0).to(device)
    with torch.no_grad():
        before = Trainer(model, build_objective(AlgoConfig()),
                         TrainerOptions(pad_id=0, lr=0.0))._forward(model, probe)[0]
    assert (before * probe.mask - full[1]).abs().max() > 1e-3
    assert sum(full[3]) == 11 + 6 + 11  # every sample of every step
    if algo.kl_in_reward:  # at step 1 the policy is the reference (no penalty); after
        # that each sample's penalty differs, so no advantage is 0 and nothing is skipped
        assert skip[3] == [LIVE, 6, 11]
        assert [m["train/skipped_share"] for m in skip[2]] == pytest.approx([6 / 11, 0, 0])
        return
    # only the samples with signal; with 2 mini-batches the second batch's latter half
    # ([1, 1, 1, 1]'s last three) has none and passes one sample for its optimiser step
    assert sum(skip[3]) == LIVE + 2 + LIVE + (kw.get("minibatches", 1) == 2)
    assert [m["train/skipped_share"] for m in skip[2]] == \
        pytest.approx([6 / 11, 4 / 6, 6 / 11])
    for m_full, m_skip in zip(full[2], skip[2]):
        assert m_skip["loss/policy"] == pytest.approx(m_full["loss/policy"], abs=1e-6)
        assert m_skip["grad_norm"] == pytest.approx(m_full["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("algo, kw, weights, passed", [
    # MC-GRPO: A = r - the group's lower median, whose member is a pivot (include False,
    # not trained): in [1, 0, 0] and [1, 0] the median is 0, so only the two 1s have signal
    (AlgoConfig(advantage="mc_grpo"), {}, None, 2),
    # a zero sample weight removes a sample with signal (group 0's first, A > 0)
    (AlgoConfig(), {}, [0.0] + [1.0] * 10, 4),
    # dual clip, truncated IS and the textbook separate proximal pass
    (AlgoConfig(correction="tis_token", surrogate_args={"dual_clip": 3.0}),
     {"reuse_prox": False, "micro_batch": 4}, None, 5),
])
def test_pivots_zero_weights_and_other_objectives_skip_exactly(tiny, algo, kw, weights, passed,
                                                              device):
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    full = run(model, start, algo, [MIXED, MIXED], skip=False, weights=weights, **kw)
    skip = run(model, start, algo, [MIXED, MIXED], skip=True, weights=weights, **kw)
    assert_same_update(full, skip)
    assert sum(full[3]) == 22 and sum(skip[3]) == 2 * passed


def test_a_step_whose_samples_are_all_inert_still_makes_adams_momentum_step(tiny, device):
    """After an informative step, a batch of uniform groups has zero gradient, yet AdamW's
    momentum moves the weights: one sample is passed per mini-batch so that the step (with
    the same parameters holding gradients) happens exactly as with the full pass."""
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    batches = [MIXED, [[1.0, 1.0], [0.0, 0.0, 0.0]]]
    full = run(model, start, AlgoConfig(), batches, skip=False, minibatches=2, micro_batch=2)
    skip = run(model, start, AlgoConfig(), batches, skip=True, minibatches=2, micro_batch=2)
    assert_same_update(full, skip)
    assert skip[3][-2:] == [1, 1]  # the inert step: one sample in each of its mini-batches
    assert skip[2][1]["grad_norm"] == 0.0 and skip[2][1]["train/skipped_share"] == 1.0


@pytest.mark.parametrize("algo", [AlgoConfig(kl_coef=0.05),  # the KL term has A-free gradient
                                  AlgoConfig(ess_lr=True)])  # the ESS needs every sample
def test_objectives_where_zero_advantage_is_not_inert_pass_every_sample(tiny, algo, device):
    model, _ = tiny
    model.to(device)
    assert not build_objective(algo).zero_advantage_inert
    start = {k: v.clone() for k, v in model.state_dict().items()}
    _, _, metrics, rows = run(model, start, algo, [MIXED], skip=True)
    assert sum(rows) == 11 and metrics[0]["train/skipped_share"] == 0.0


def test_which_objectives_are_inert_at_zero_advantage():
    yes = [AlgoConfig(), AlgoConfig(surrogate="gspo_token"), AlgoConfig(correction="mis_geo"),
           AlgoConfig(kl_coef=0.1, kl_in_reward=True)]
    no = [AlgoConfig(kl_coef=0.1), AlgoConfig(ess_lr=True)]
    assert [build_objective(a).zero_advantage_inert for a in yes] == [True] * 4
    assert [build_objective(a).zero_advantage_inert for a in no] == [False] * 2


def test_the_logged_loss_does_not_depend_on_the_micro_batch_size(tiny, device):
    """loss/* metrics add up the micro-batches' shares (the mini-batch's loss), so how the
    batch is split, or how many samples are skipped, does not change the number logged."""
    model, _ = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    got = [run(model, start, AlgoConfig(), [MIXED], skip=skip, micro_batch=mb)[2][0]
           ["loss/policy"] for skip in (False, True) for mb in (64, 2)]
    assert got == pytest.approx([got[0]] * 4, abs=1e-7)
    assert got[0] != 0.0


def test_mixture_of_experts_models_pass_every_sample(tiny_dir, tmp_path, device):
    """An expert that only skipped samples reach would get no gradient at all (no AdamW step)
    instead of a zero one, so `build_trainer` turns the skip off for such models."""
    from transformers import MixtralConfig, MixtralForCausalLM

    from reroll import build
    from reroll.config_checks import load_checked
    from reroll.models import load

    _, tok = load(tiny_dir)
    moe = MixtralForCausalLM(MixtralConfig(vocab_size=len(tok), hidden_size=32,
                                           intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1,
                                           num_local_experts=4, num_experts_per_tok=2))
    moe.save_pretrained(tmp_path / "moe")
    tok.save_pretrained(tmp_path / "moe")
    cfg = load_checked(None, [f"model.device={device}"])
    assert build.build_trainer(cfg, tiny_dir).options.skip_inert
    assert not build.build_trainer(cfg, tmp_path / "moe").options.skip_inert
