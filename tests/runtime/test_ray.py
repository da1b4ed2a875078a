"""The Ray runtime on this machine's CPUs: engine replicas as actors behind the Engine
interface (a killed worker's in-flight requests are re-queued and nothing is lost), and the
trainer as an actor behind the TrainerHandle: a Ray run ends with the same weights as a local
run and as a stopped-and-resumed Ray run (bitwise), in-loop evaluation sees the trained
weights, and a killed trainer actor stops the run with a clear error, checkpoints intact."""

import os

import pytest
import torch

ray = pytest.importorskip("ray")

from reroll.config_checks import load_checked  # noqa: E402
from reroll.rollout import Example, SamplingParams, new_group  # noqa: E402

pytestmark = pytest.mark.ray  # `ray_session`: conftest.py


def test_killed_engine_worker_requests_are_requeued(ray_session, tiny_dir, device):
    from reroll.runtime.ray import RayEnginePool

    pool = RayEnginePool(tiny_dir, workers=2, max_batch=16, device=str(device))
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, stop_token_ids=[])
    groups = [new_group(Example(f"p{i}", "", ""), 4, [2, 5 + i, 6], sp, 0) for i in range(4)]
    rollouts = [r for g in groups for r in g.rollouts]
    for i, r in enumerate(rollouts):
        r.sampling.seed = i
    pool.add(rollouts)
    done = {r.sample_id: r for r in pool.step()}  # prefill + first token on both workers
    assert pool.pending() == 16 - len(done) and pool.inflight[0]
    pool.kill_worker(0)
    while pool.pending():
        for r in pool.step():
            done[r.sample_id] = r
    assert set(done) == {r.sample_id for r in rollouts}  # nothing lost
    assert all(r.response_len == 12 and r.finish == "length" for r in done.values())
    st = pool.stats()
    assert st["restarts"] == 1 and st["requeued"] >= 1
    pool.shutdown()


def test_a_worker_killed_before_its_adds_are_confirmed_loses_nothing(ray_session, tiny_dir,
                                                                      device):
    # adds are sent without waiting (`RayEnginePool.add`): a worker that dies with adds of
    # its own unconfirmed is replaced once, at the next step, and their requests re-queued
    from reroll.runtime.ray import RayEnginePool

    pool = RayEnginePool(tiny_dir, workers=2, max_batch=16, device=str(device))
    sp = SamplingParams(temperature=1.0, max_new_tokens=6, stop_token_ids=[])
    groups = [new_group(Example(f"p{i}", "", ""), 3, [2, 5 + i], sp, 0) for i in range(4)]
    rollouts = [r for g in groups for r in g.rollouts]
    for i, r in enumerate(rollouts):
        r.sampling.seed = i
    pool.kill_worker(0)  # dead before anything is sent to it
    pool.add(rollouts)
    lost = len(pool.inflight[0])
    assert lost == 6  # two of the four groups went to worker 0
    done = {}
    while pool.pending():
        for r in pool.step():
            done[r.sample_id] = r
    assert set(done) == {r.sample_id for r in rollouts}
    assert all(r.response_len == 6 and r.finish == "length" for r in done.values())
    st = pool.stats()
    assert st["restarts"] == 1 and st["requeued"] == lost
    pool.shutdown()


def test_an_add_the_engine_refuses_is_raised_at_the_next_step(ray_session, tiny_dir, device):
    # the engine refuses a request it already holds; the pool's records keep the first
    # (still decoding), and the error reaches the caller at its next call, not never
    from reroll.runtime.ray import RayEnginePool

    pool = RayEnginePool(tiny_dir, workers=1, max_batch=16, device=str(device))
    sp = SamplingParams(temperature=1.0, max_new_tokens=4, stop_token_ids=[])
    g = new_group(Example("p", "", ""), 2, [2, 5], sp, 0)
    pool.add(g.rollouts)
    pool.add(g.rollouts[:1])
    with pytest.raises(Exception, match="already in the engine"):
        pool.step()
    assert pool.pending() == 2 and not pool._adds
    done = {}
    while pool.pending():
        for r in pool.step():
            done[r.sample_id] = r
    assert set(done) == {r.sample_id for r in g.rollouts}
    pool.shutdown()


def test_train_runs_on_ray_engine_workers(ray_session, tmp_path, device):
    from reroll.runlog import read_metrics
    from reroll.runtime import train

    cfg = load_checked(None, ["model.max_position=32", "task.args.digits=1",
                              "task.args.n_train=80", "task.args.n_test=20",
                              "rollout.group_size=4", "rollout.batch_groups=4",
                              "rollout.max_new_tokens=4", "reward.workers=0",
                              "runtime.kind=ray", "runtime.engine_workers=2",
                              "runtime.max_staleness=1", "train.steps=3", "runtime.threads=1", "log_every=1",
                              f"out_dir={tmp_path}", f"model.device={device}"])
    train(cfg, progress=False)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["pipeline/consumed"] == 12


def test_scoring_actors_take_the_runs_worker_crash_bound(ray_session):
    """reward.max_worker_crashes reaches the pool inside each scoring actor (the bound after
    which a reward that keeps killing its workers stops being retried)."""
    import ray

    from reroll.runtime.ray_scoring import RayScoringPool

    pool = RayScoringPool([{"name": "exact"}], {}, actors=1, workers=0, timeout_s=30,
                          max_worker_crashes=3)
    try:
        got = ray.get(pool.actors[0].__ray_call__.remote(lambda a: a.pool.max_worker_crashes))
        assert got == 3
    finally:
        pool.close()


def test_killed_scoring_actor_calls_are_sent_again_and_nothing_is_lost(ray_session):
    from reroll.rollout import Rollout
    from reroll.runtime.ray_scoring import RayScoringPool

    specs = [{"name": "math"}, {"name": "numeric", "args": {"tolerance": 0.01}, "weight": 0.5}]
    texts = [r"\boxed{0.5}", "0.499", "1/3", "none"] * 3
    ex = Example("p", "q", "1/2")
    pool = RayScoringPool(specs, {}, actors=2, workers=0, timeout_s=30)
    futs = [pool.submit(Rollout("p", "g", [0], 0, completion=t), ex) for t in texts]
    pool.kill_actor(0)  # half the calls went to it; it is still starting, so few if any answered
    got = [f.result(timeout=120) for f in futs]
    # math 1/0, numeric |x - 0.5| <= 0.01 at weight 0.5, as on the local pool
    assert [pool.combine(g) for g in got] == [1.5, 0.5, 0.0, 0.0] * 3
    s = pool.stats()
    assert s["restarts"] == 1 and 1 <= s["requeued"] <= 6 and s["error_total"] == 0
    # every call answered once by a live actor, or by the dead one before it died
    assert s["calls"] + (6 - s["requeued"]) == 12 and s["pending"] == 0
    pool.close()


# ---- the trainer as a Ray actor -------------------------------------------------------------
# 1-digit addition, 3 synchronous steps (max_staleness 0), one engine worker, one thread. The
# untrained model never answers right (all-zero groups: no update at all), so the reward is
# "a digit anywhere in the completion": measured 0.375, 0.375, 0.19 mean reward, grad norm
# 1.7-2.6 per step, so every step really moves the weights.
EQUIV = ['reward.verifiers=[{name="format", args={pattern="[0-9]", fullmatch=false}}]',
         "model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
         "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
         "rollout.max_new_tokens=4", "reward.workers=0", "train.lr=3e-4", "log_every=1",
         "runtime.max_staleness=0", "runtime.engine_workers=1", "runtime.threads=1",
         "ckpt_every=1"]


DEVICE = ["model.device=cpu"]  # the runs' models go on --device (set by _on_device)


@pytest.fixture(scope="module", autouse=True)  # before the module-scoped runs
def _on_device(on_device):
    DEVICE[:] = on_device


def equiv_cfg(out, *extra):
    return load_checked(None, EQUIV + DEVICE + [f"out_dir={out}", *extra])


def final_weights(run_dir, step=3):
    from safetensors.torch import load_file

    return load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" /
                         "model.safetensors"))


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module")
def ray_run(ray_session, tmp_path_factory):
    """The uninterrupted 3-step Ray run (trainer actor + engine actor), evaluated in-loop at
    step 3; returns (run dir, the weights the in-loop evaluation saw)."""
    import reroll.trainer.evaluate as loop  # the evaluator the composition calls
    from reroll.runtime import train

    out = tmp_path_factory.mktemp("ray_run")
    seen, real = {}, loop.evaluate

    def spy(model, *args, **kwargs):
        seen.update({k: v.cpu().clone() for k, v in model.state_dict().items()})
        return real(model, *args, **kwargs)

    loop.evaluate = spy
    try:
        train(equiv_cfg(out, "runtime.kind=ray", "runtime.scoring_workers=1", "train.steps=3", "eval.every=3",
                        "eval.n_examples=4"), progress=False)
    finally:
        loop.evaluate = real
    return out, seen


def test_trainer_actor_run_equals_local_run_bitwise(ray_run, tmp_path):
    from reroll.runlog import read_metrics
    from reroll.runtime import train

    out, _ = ray_run
    train(equiv_cfg(tmp_path, "runtime.kind=local", "train.steps=3"), progress=False)
    # same sampled tokens (per-request seeds), same float ops in one thread each: bitwise
    assert_bitwise_equal(final_weights(out), final_weights(tmp_path))
    ray_rows = [r for r in read_metrics(out) if r["step"] > 0]  # step 0: the initial eval
    local_rows = read_metrics(tmp_path)
    assert all(r["grad_norm"] > 0 for r in ray_rows)  # not the trivial no-update case
    assert [r["reward/mean"] for r in ray_rows] == [r["reward/mean"] for r in local_rows]
    assert ray_rows[-1]["pipeline/consumed"] == 12  # 3 steps x 4 groups


def test_in_loop_evaluation_on_ray_sees_the_trained_weights(ray_run):
    from reroll.runlog import read_metrics

    out, seen = ray_run
    first = read_metrics(out)[0]  # the curve starts with the untrained policy at step 0
    assert first["step"] == 0 and 0.0 <= first["eval/greedy_accuracy"] <= 1.0
    final = final_weights(out)
    assert seen and final.keys() <= seen.keys()
    for k in final:  # step 3's weights, not the initial ones the driver could have kept
        assert torch.equal(seen[k], final[k]), k
    init = ray_run[0] / "init" / "model.safetensors"
    from safetensors.torch import load_file

    start = load_file(str(init))
    assert any(not torch.equal(start[k], final[k]) for k in final)  # training moved them


def test_ray_stop_at_2_then_resume_to_3_equals_uninterrupted(ray_run, tmp_path):
    from reroll.runlog import read_metrics
    from reroll.runtime import train

    out, _ = ray_run
    train(equiv_cfg(tmp_path, "runtime.kind=ray", "train.steps=2"), progress=False)
    train(equiv_cfg(tmp_path, "runtime.kind=ray", "train.steps=3"), resume=True,
          progress=False)
    assert_bitwise_equal(final_weights(out), final_weights(tmp_path))
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_killed_trainer_actor_stops_the_run_clearly_and_resume_loses_nothing(ray_run, tmp_path,
                                                                           monkeypatch):
    from reroll.runtime import train
    from reroll.runtime.ray import RayTrainer
    from reroll.trainer import checkpoint

    real_step, calls = RayTrainer.step, []

    def step_then_die(self, groups, referenced=None):
        calls.append(1)
        if len(calls) == 2:  # step 1 is trained and checkpointed; the actor dies before step 2
            self.kill()
        return real_step(self, groups, referenced)

    monkeypatch.setattr(RayTrainer, "step", step_then_die)
    with pytest.raises(RuntimeError, match=r"trainer actor died.*--resume.*last checkpoint"):
        train(equiv_cfg(tmp_path, "runtime.kind=ray", "train.steps=3"), progress=False)
    ck = checkpoint.latest(tmp_path)
    assert ck.name == "step_000001"  # what was checkpointed is intact and loadable
    assert checkpoint.read_state(ck)["version"] == 1
    monkeypatch.setattr(RayTrainer, "step", real_step)
    train(equiv_cfg(tmp_path, "runtime.kind=ray", "train.steps=3"), resume=True, progress=False)
    assert_bitwise_equal(final_weights(ray_run[0]), final_weights(tmp_path))


# ---- GPU reservations --------------------------------------------------------------------------
def test_gpu_reservations_place_the_actors_and_the_run_is_unchanged(ray_run, tmp_path):
    """Trainer and engine actor each reserve half of the session's GPU: Ray places both on it
    (its id, and CUDA_VISIBLE_DEVICES naming only it), each resolves model.device inside
    itself, and the run ends with the same weights as without reservations."""
    from reroll.runtime import ray as rr
    from reroll.runtime import train

    seen = {}
    real = rr.components

    def spy(cfg, init_dir, ckpt, tok, task):
        parts = real(cfg, init_dir, ckpt, tok, task)
        seen["trainer"] = parts.trainer.placement()
        seen["engines"] = parts.engine_core.placement()
        return parts

    rr.components = spy
    try:
        train(equiv_cfg(tmp_path, "runtime.kind=ray", "train.steps=3",
                        "runtime.trainer_gpus=0.5", "runtime.engine_gpus=0.5",
                        "model.device=auto"), progress=False)
    finally:
        rr.components = real
    assert_bitwise_equal(final_weights(ray_run[0]), final_weights(tmp_path))
    gpu = ray.cluster_resources()["GPU"]
    assert gpu >= 1
    for p in [seen["trainer"], *seen["engines"]]:
        assert len(p["gpu_ids"]) == 1  # its share of one GPU, and only that one visible
        assert p["cuda_visible_devices"] == p["gpu_ids"][0]
        assert p["device"] == DEVICE[0].split("=")[1]  # auto: cuda where torch sees it
    assert len(seen["engines"]) == 1


def test_gpu_reservations_the_cluster_cannot_meet_are_refused_before_any_actor(ray_session,
                                                                             tmp_path):
    from reroll.runtime.ray_placement import check_gpus

    have = ray.cluster_resources()["GPU"]
    cfg = equiv_cfg(tmp_path, "runtime.kind=ray", "runtime.engine_workers=2",
                    f"runtime.engine_gpus={have}", "runtime.trainer_gpus=0.5",
                    "model.device=auto")
    with pytest.raises(ValueError, match=rf"runtime.engine_gpus = {have:g} x 2 engine worker"
                                         rf".*= {2 * have + 0.5:g} GPU.*the Ray cluster has "
                                         rf"{have:g} GPU"):
        check_gpus(cfg)
    one = equiv_cfg(tmp_path, "runtime.kind=ray", f"runtime.trainer_gpus={have + 1}",
                    "engine.device=cpu", "model.device=auto")
    with pytest.raises(ValueError, match=rf"runtime.trainer_gpus = {have + 1:g} = {have + 1:g} "
                                         rf"GPU\(s\), but the Ray cluster has {have:g} GPU"):
        check_gpus(one)
    check_gpus(equiv_cfg(tmp_path, "runtime.kind=ray", "runtime.engine_gpus=0.5",
                         "runtime.trainer_gpus=0.5", "model.device=auto"))  # fits: no error


def test_lora_ray_run_equals_local_run_bitwise(ray_session, tmp_path):
    """With ``[lora]`` the trainer actor trains the adapter and publishes merged weights to
    the engine actor: its checkpoints equal a local LoRA run's, bit for bit."""
    pytest.importorskip("peft", reason="[lora] trains adapters through peft (reroll[lora])")
    from safetensors.torch import load_file

    from reroll import lora
    from reroll.runlog import read_metrics
    from reroll.runtime import train

    runs = {kind: tmp_path / kind for kind in ("ray", "local")}
    for kind, out in runs.items():
        train(equiv_cfg(out, f"runtime.kind={kind}", "lora.rank=4", "lora.alpha=8",
                        "train.steps=2"), progress=False)

    def adapter(run, step):
        model = run / "checkpoints" / f"step_{step:06d}" / "model"
        assert not (model / "model.safetensors").exists()  # the adapter, not a full copy
        return load_file(str(model / lora.ADAPTER_WEIGHTS))

    assert_bitwise_equal(adapter(runs["ray"], 2), adapter(runs["local"], 2))
    first, last = adapter(runs["ray"], 1), adapter(runs["ray"], 2)
    assert not all(torch.equal(first[k], last[k]) for k in last)  # step 2 moved the adapter
    rows = {kind: read_metrics(out) for kind, out in runs.items()}
    assert all(r["grad_norm"] > 0 for r in rows["ray"])
    assert [r["reward/mean"] for r in rows["ray"]] == [r["reward/mean"] for r in rows["local"]]


def test_pinned_cores_place_each_side_on_its_own_core_and_the_run_is_unchanged(ray_run, tmp_path):
    """runtime.pin_cores: the engine actor (and the driver) on the first allowed core, the
    trainer actor on the second; the run ends with the same weights as unpinned."""
    from reroll.runtime import ray as rr
    from reroll.runtime import train

    allowed, seen, real = sorted(os.sched_getaffinity(0)), {}, rr.components
    if len(allowed) < 2:
        pytest.skip("needs two cores")

    def spy(cfg, init_dir, ckpt, tok, task):
        parts = real(cfg, init_dir, ckpt, tok, task)
        seen["trainer"] = parts.trainer.placement()
        seen["engines"] = parts.engine_core.placement()
        seen["driver"] = sorted(os.sched_getaffinity(0))
        return parts

    rr.components = spy
    try:
        train(equiv_cfg(tmp_path, "runtime.kind=ray", "train.steps=3", "runtime.pin_cores=true"),
              progress=False)
    finally:
        rr.components = real
    assert [e["cores"] for e in seen["engines"]] == [[allowed[0]]]
    assert seen["trainer"]["cores"] == [allowed[1]]
    assert seen["driver"] == [allowed[0]]  # the driver on the engine's core during the run
    assert sorted(os.sched_getaffinity(0)) == allowed  # the driver's cores given back
    assert_bitwise_equal(final_weights(ray_run[0]), final_weights(tmp_path))
