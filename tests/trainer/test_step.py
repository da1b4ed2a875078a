"""The train step end to end on groups of different sizes: rewards and group indices are
flattened in group order, advantages are per group whatever its size, and each sample's
weight reaches the loss."""

import pytest
import torch

from reroll.algo import build_objective
from reroll.config import AlgoConfig
from reroll.rollout import Example, SamplingParams, Score, new_group
from reroll.trainer.batch import flatten
from reroll.trainer.options import TrainerOptions
from reroll.trainer.step import Trainer


def groups_of(sizes_rewards):
    out = []
    for i, rewards in enumerate(sizes_rewards):
        g = new_group(Example(f"p{i}", "1+1=", "2"), len(rewards), [2, 5, 6],
                      SamplingParams(), 0)
        for r, rew in zip(g.rollouts, rewards):
            for t in (7, 8):
                r.append(t, -4.0, 0)
            r.finish, r.scores, r.reward = "stop", [Score("exact", value=rew)], rew
        out.append(g)
    return out


def test_groups_of_different_sizes_flatten_in_order_with_their_own_baselines():
    groups = groups_of([[1.0, 0.0], [1.0, 1.0, 0.0]])
    _, rewards, _, gidx = flatten(groups)
    assert rewards.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0] and gidx.tolist() == [0, 0, 1, 1, 1]
    obj = build_objective(AlgoConfig(advantage="grpo", advantage_args={"eps": 0.0}))
    adv, _ = obj.advantages(rewards, rewards[:, None], gidx)
    # group 0: mean 0.5, unbiased std sqrt(0.5) = 0.7071: +-0.7071
    # group 1: mean 2/3, std sqrt(((1/3)^2 * 2 + (2/3)^2) / 2) = sqrt(1/3) = 0.5774:
    #          1/3 / 0.5774 = 0.5774, -2/3 / 0.5774 = -1.1547
    expect = torch.tensor([0.7071, -0.7071, 0.5774, 0.5774, -1.1547])
    assert torch.allclose(adv, expect, atol=1e-4)


def test_a_zero_sample_weight_removes_that_samples_gradient(tiny, device):
    model, tok = tiny
    model.to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def grad_after(weights):
        model.load_state_dict(state)
        groups = groups_of([[1.0, 0.0], [1.0, 1.0, 0.0]])
        for r, w in zip([r for g in groups for r in g.rollouts], weights):
            r.sample_weight = w
        t = Trainer(model, build_objective(AlgoConfig(correction="none")),
                    TrainerOptions(pad_id=0, lr=0.0, grad_clip=0.0))
        t.step(groups)
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    full = grad_after([1, 1, 1, 1, 1])
    # group 1's samples zeroed: the gradient is group 0's part alone, which is what a batch
    # with group 1's advantages at 0 gives (its rewards all equal: [1, 1, 1])
    only0 = grad_after([1, 1, 0, 0, 0])
    model.load_state_dict(state)
    same = groups_of([[1.0, 0.0], [1.0, 1.0, 1.0]])
    t = Trainer(model, build_objective(AlgoConfig(correction="none")),
                TrainerOptions(pad_id=0, lr=0.0, grad_clip=0.0))
    t.step(same)
    ref = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert not torch.allclose(full, only0)
    assert torch.allclose(only0, ref, atol=1e-7)


def test_env_metrics_average_per_episode_sums_of_step_info():
    from reroll.rollout import Rollout
    from reroll.trainer.metrics import env_metrics

    def episode(steps):
        r = Rollout(prompt_id="p", group_id="g", tokens=[1], prompt_len=1)
        r.scores = [Score("env", value=1.0, info={"turns": len(steps), "steps": steps})]
        return r

    a = episode([{"reward": 0.0, "done": False, "tool_called": True, "tool_ok": True},
                 {"reward": 1.0, "done": True, "tool_called": False, "tool_ok": False}])
    b = episode([{"reward": 0.0, "done": True, "tool_called": True, "tool_ok": False,
                  "note": "text is ignored"}])
    m = env_metrics([a, b])
    # turns (2 + 1) / 2 = 1.5; tool_called per episode (1 + 1) / 2 = 1; tool_ok (1 + 0) / 2
    # = 0.5; reward per episode (1 + 0) / 2 = 0.5; "done" and text keys are left out
    assert m == {"env/turns": 1.5, "env/reward": 0.5, "env/tool_called": 1.0,
                 "env/tool_ok": 0.5}
    assert env_metrics([Rollout(prompt_id="p", group_id="g", tokens=[1], prompt_len=1)]) == {}


def test_a_non_finite_loss_after_some_minibatches_stepped_restores_weights_and_optimiser(
        tiny, device):
    model, _ = tiny
    model.to(device)
    t = Trainer(model, build_objective(AlgoConfig(correction="none")),
                TrainerOptions(pad_id=0, lr=1e-2, minibatches=2, micro_batch=2, grad_clip=0.0))
    t.step(groups_of([[1.0, 0.0], [1.0, 0.0]]))  # optimiser state exists now
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt_before = {k: v.clone() for k, v in t.opt.state[next(iter(model.parameters()))].items()}
    groups = groups_of([[1.0, 0.0], [1.0, 0.0]])
    real, calls = t.objective.loss, []

    def nan_in_second_minibatch(inp):  # mini-batch 1 steps; mini-batch 2's loss is NaN
        calls.append(1)
        loss, m = real(inp)
        return (loss * float("nan"), m) if len(calls) == 2 else (loss, m)

    t.objective.loss = nan_in_second_minibatch
    with pytest.raises(FloatingPointError, match="weights and optimiser left at the last good"):
        t.step(groups)
    assert t.version == 1
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # mini-batch 1 was undone
    opt_after = t.opt.state[next(iter(model.parameters()))]
    assert all(torch.equal(opt_before[k], opt_after[k]) for k in opt_before)


def test_groups_of_different_sizes_collate_log_and_checkpoint_as_they_are(tiny, tmp_path,
                                                                           device):
    """Variable-size groups end to end: collation keeps one row per sample, the step's
    metrics count samples (not groups x a fixed size), and a checkpoint gives back each
    unconsumed group with its own size and target."""
    from reroll.trainer import checkpoint
    from reroll.trainer.batch import collate
    from reroll.trainer.metrics import batch_metrics

    model, tok = tiny
    groups = groups_of([[1.0, 0.0], [1.0, 1.0, 0.0, 0.0, 1.0]])
    groups[1].rollouts[4].append(9, -1.0, 0)  # one sample one token longer
    rollouts = [r for g in groups for r in g.rollouts]
    b = collate(rollouts, pad_id=0)
    assert b.input_ids.shape == (7, 6)  # 7 samples; longest 3 prompt + 3 sampled tokens
    assert b.mask.sum(-1).tolist() == [2.0] * 6 + [3.0]  # policy tokens per row
    empty = {"engine": {}, "counters": {"started": 2, "consumed": 2, "dropped": {}},
             "score_errors": {}}
    m = batch_metrics(groups, empty, empty, wait_s=0.0, train_s=0.0, step_s=1.0)
    assert m["pipeline/groups_in_batch"] == 2 and m["pipeline/samples_in_batch"] == 7
    assert m["reward/mean"] == pytest.approx(4 / 7) and m["reward/accuracy"] == pytest.approx(4 / 7)
    assert m["length/mean"] == pytest.approx(15 / 7) and m["length/max"] == 3
    assert m["throughput/trajectories_per_s"] == 7
    assert not any(k.startswith("engine/fail") for k in m)  # counters the engine lacks
    assert "shaping/shaped_share" not in m  # no control rule shaped a reward
    rollouts[6].shaping["dot"] = -1.0  # one of the 7 cut by a shaper
    m = batch_metrics(groups, empty, empty, wait_s=0.0, train_s=0.0, step_s=1.0)
    assert m["shaping/shaped_share"] == pytest.approx(1 / 7)
    rollouts[6].shaping.clear()
    fleet = {**empty, "engine": {"failovers": 8.0, "server_failures": 1.0, "servers_alive": 1.0,
                                 "tokens_generated": 5.0}}
    m = batch_metrics(groups, empty, fleet, wait_s=0.0, train_s=0.0, step_s=1.0)
    assert (m["engine/failovers"], m["engine/server_failures"], m["engine/servers_alive"]) == \
        (8.0, 1.0, 1.0)

    model.to(device)
    t = Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=1e-3), tokenizer=tok)
    partial = groups_of([[1.0], [0.0, 1.0, 1.0]])
    partial[1].rollouts[2].finish = "running"  # still generating when the checkpoint came
    ck = t.save_checkpoint(tmp_path, 1, {"version": 1}, partial)
    back = checkpoint.read_groups(ck)
    assert [len(g.rollouts) for g in back] == [1, 3]
    assert [g.target_size for g in back] == [1, 3]
    assert [[r.finish for r in g.rollouts] for g in back] == [["stop"], ["stop", "stop", "running"]]
    assert [[r.tokens for r in g.rollouts] for g in back] == \
        [[r.tokens for r in g.rollouts] for g in partial]


@pytest.mark.parametrize("correction", ["tis_token", "mis_seq"])
def test_one_minibatch_reuses_the_loss_forward_as_pi_prox_with_the_same_update(tiny, correction,
                                                                               device):
    """With one mini-batch, pi_prox (the policy at the start of the update) is what the
    loss's own forward computes: skipping the separate proximal pass gives bitwise the same
    weights, optimiser state and metrics as the textbook order (a forward pass fewer)."""
    model, tok = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    out = []
    for reuse in (True, False):
        model.load_state_dict(start)
        groups = groups_of([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
        for i, r in enumerate(r for g in groups for r in g.rollouts):
            r.logprobs[-2:] = [-3.5 + 0.1 * i, -4.2]  # behaviour log-probs unlike the policy's
        t = Trainer(model, build_objective(AlgoConfig(correction=correction)),
                    TrainerOptions(pad_id=0, lr=1e-2, micro_batch=3, reuse_prox=reuse))
        calls = []
        orig = t._logprobs
        t._logprobs = lambda m, b, calls=calls, orig=orig: calls.append(1) or orig(m, b)
        m = t.step(groups)
        out.append(({k: v.clone() for k, v in model.state_dict().items()}, m, len(calls)))
    (w_a, m_a, calls_a), (w_b, m_b, calls_b) = out
    assert (calls_a, calls_b) == (0, 1)  # the reused path makes no proximal pass
    assert all(torch.equal(w_a[k], w_b[k]) for k in w_a)
    assert any(not torch.equal(w_a[k], start[k]) for k in w_a)  # the step did move the weights
    assert m_a == m_b


def test_a_linear_schedule_warms_up_then_decays_to_zero_at_the_last_step_and_resumes(
        tiny, tmp_path, device):
    """train.schedule = "linear": lr x min(1, (k + 1) / warmup) x (1 - k / steps) at update k
    (0-based), worked out by hand for lr 1e-3, 2 warm-up steps, 5 steps; a trainer restored
    from a checkpoint after 3 updates continues the same sequence."""
    from reroll.trainer import checkpoint

    model, tok = tiny
    model.to(device)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def trainer():
        return Trainer(model, build_objective(AlgoConfig()),
                       TrainerOptions(pad_id=0, lr=1e-3, warmup_steps=2, schedule="linear",
                                      total_steps=5), tokenizer=tok)

    t = trainer()
    lrs = [t.opt.param_groups[0]["lr"]]
    for _ in range(5):
        lrs.append(t.step(groups_of([[1.0, 0.0], [0.0, 1.0]]))["lr"])
    # k = 0: 1/2 x 1; k = 1: 1 x 4/5; k = 2: 3/5; k = 3: 2/5; k = 4: 1/5; k = 5: 0
    assert lrs == pytest.approx([5e-4, 8e-4, 6e-4, 4e-4, 2e-4, 0.0], abs=1e-12)

    model.load_state_dict(state)
    t = trainer()
    for _ in range(3):
        t.step(groups_of([[1.0, 0.0], [0.0, 1.0]]))
    ck = t.save_checkpoint(tmp_path, 3, {"version": 3}, [])
    back = trainer()
    checkpoint.load_trainer_state(ck, back.opt, back.sched)
    assert back.opt.param_groups[0]["lr"] == pytest.approx(4e-4, abs=1e-12)
    assert back.step(groups_of([[1.0, 0.0], [0.0, 1.0]]))["lr"] == pytest.approx(2e-4, abs=1e-12)


def test_a_checkpoint_restores_the_random_state_of_the_trainers_device(tiny, tmp_path, device):
    """rng.pt holds the CPU generators' states and, where the trainer runs on a GPU, the CUDA
    generators' too: a resumed run draws the same numbers on its device."""
    from reroll.trainer import checkpoint

    model, tok = tiny
    model.to(device)
    t = Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=1e-3), tokenizer=tok)
    ck = t.save_checkpoint(tmp_path, 1, {"version": 0}, [])
    first = [torch.randn(8), torch.randn(8, device=device)]
    checkpoint.load_trainer_state(ck, t.opt, t.sched)
    again = [torch.randn(8), torch.randn(8, device=device)]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_cuda_random_states_for_other_devices_than_this_process_sees_are_not_restored():
    """A checkpoint from a process that saw another number of GPUs: its CPU generators come
    back, its CUDA states do not (they could land on other devices), with a warning."""
    from reroll.trainer import checkpoint

    state = checkpoint.rng_state()
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    state["cuda"] = [torch.zeros(16, dtype=torch.uint8)] * (seen + 1)
    first = torch.randn(4)
    with pytest.warns(RuntimeWarning, match=rf"CUDA random state of {seen + 1} device\(s\) "
                                            rf"is not restored: this process sees {seen}"):
        checkpoint.set_rng_state(state)
    assert torch.equal(torch.randn(4), first)


def test_an_unknown_train_schedule_fails_when_the_trainer_is_built_naming_the_key(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="train.schedule must be one of"):
        Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=1e-3, schedule="cosine"))
    with pytest.raises(ValueError, match="needs the number of updates it decays over"):
        Trainer(model, build_objective(AlgoConfig()),
                TrainerOptions(pad_id=0, lr=1e-3, schedule="linear"))


def test_a_resume_that_moves_the_end_of_a_linear_decay_is_refused(tmp_path, small_run):
    """train.steps may change on resume (the run goes on longer), except where it is the
    end of a linear lr decay: that would change every later update's lr."""
    from reroll.config import ConfigError
    from reroll.runlog import RunDir

    out = tmp_path / "run"
    rd = RunDir(small_run(out, "train.steps=4", "train.schedule=linear"))
    rd.commit()
    rd.close()
    with pytest.raises(ConfigError, match=r"linear lr decay's end .*: 4 -> 3; set "
                                          r"train.schedule_steps=4 to keep the run's"):
        RunDir(small_run(out, "train.steps=3", "train.schedule=linear"), resume=True)
    RunDir(small_run(out, "train.steps=3", "train.schedule=linear", "train.schedule_steps=4"),
           resume=True).close()
    # a longer run: never the updates after the decay's end at a learning rate of 0
    with pytest.raises(ConfigError, match=r"linear lr decay's end .*: 4 -> 6; a decaying schedule "
                                          r"cannot be extended .* keep train.steps <= 4 with "
                                          r"train.schedule_steps=4, or .* \(init="):
        RunDir(small_run(out, "train.steps=6", "train.schedule=linear"), resume=True)
    with pytest.raises(ConfigError, match=r"learning rate to 0 at update train.schedule_steps "
                                          r"= 4, before train.steps = 6"):
        small_run(out, "train.steps=6", "train.schedule=linear", "train.schedule_steps=4")
    RunDir(small_run(out, "train.steps=4", "train.schedule=linear"), resume=True).close()
    const = tmp_path / "const"
    RunDir(small_run(const, "train.steps=4")).commit()
    RunDir(small_run(const, "train.steps=6"), resume=True).close()  # constant lr: free


def test_the_fused_optimizer_makes_the_same_update_and_a_resume_keeps_the_runs_choice(
        tiny, tmp_path, device):
    """train.fused_optimizer (the default): AdamW's fused kernel. From the same weights and
    batch (so the same gradients) it makes torch's default implementation's update up to
    float rounding; a checkpoint written under either resumes under the other with the
    resuming run's kernel (the saved flag does not come back) and the same next update.
    (Compared one update at a time: over several, a gradient of pure rounding noise, e.g. an
    unused embedding row's, flips sign and AdamW turns it into an lr-sized step.)"""
    from reroll.trainer import checkpoint

    model, tok = tiny
    model.to(device)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    batch = [[1.0, 0.0], [0.0, 1.0]]

    def trainer(fused):
        t = Trainer(model, build_objective(AlgoConfig()),
                    TrainerOptions(pad_id=0, lr=1e-2, fused_optimizer=fused), tokenizer=tok)
        assert t.opt.param_groups[0]["fused"] is (True if fused else None)
        return t

    def weights():
        return {k: v.clone() for k, v in model.state_dict().items()}

    def close(a, b):  # lr 1e-2 steps, apart by rounding only (a float32 ulp near 1: 1.2e-7)
        assert any(not torch.equal(a[k], start[k]) for k in a)
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=3e-7, atol=1e-8, msg=k)

    after = {}
    for fused in (True, False):
        model.load_state_dict(start)
        t = trainer(fused)
        t.step(groups_of(batch))
        after[fused] = (weights(), t.save_checkpoint(tmp_path / str(fused), 1, {"version": 1},
                                                     []))
        t.step(groups_of(batch))
        after[fused] += (weights(),)
    close(after[True][0], after[False][0])
    for saved_by in (True, False):  # resumed by the other kernel
        w1, ck, w2 = after[saved_by]
        model.load_state_dict(w1)
        back = trainer(not saved_by)
        checkpoint.load_trainer_state(ck, back.opt, back.sched)
        assert back.opt.param_groups[0]["fused"] is (True if not saved_by else None)
        back.step(groups_of(batch))
        close(weights(), w2)


@pytest.mark.parametrize("kl_returns", ["token", "folded"])
def test_reinforce_pp_with_the_kl_in_the_reward_trains_per_token_returns(tiny, kl_returns,
                                                                          device):
    """With the penalty in the reward, REINFORCE++'s default gives each token its own return
    (the advantages vary along a response and are whitened over the batch's tokens);
    ``kl_returns = "folded"`` keeps one advantage per response."""
    import copy

    model, _ = tiny
    model.to(device)
    ref = copy.deepcopy(model)
    with torch.no_grad():  # a reference that differs from the policy: penalties are nonzero
        for p in ref.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(0))
                   .to(p.device))
    algo = AlgoConfig(advantage="reinforce_pp", kl="k1", kl_coef=0.5, kl_in_reward=True,
                      advantage_args={"baseline": True, "eps": 0.0, "kl_returns": kl_returns})
    t = Trainer(model, build_objective(algo), TrainerOptions(pad_id=0, lr=0.0),
                ref_model=ref)
    seen, loss = [], t.objective.loss
    t.objective.loss = lambda inp: seen.append(inp) or loss(inp)
    t.step(groups_of([[1.0, 0.0], [1.0, 1.0, 0.0]]))
    adv, mask = seen[0].advantages.cpu(), seen[0].mask.cpu()
    a = adv[:, -2:]  # every response is its 2 last positions
    if kl_returns == "folded":
        assert torch.equal(a[:, 0], a[:, 1])
        return
    assert not torch.allclose(a[:, 0], a[:, 1])
    assert bool((adv[mask == 0] == 0).all())
    valid = adv[mask > 0]
    assert abs(float(valid.mean())) < 1e-5 and abs(float(valid.std()) - 1.0) < 1e-5
