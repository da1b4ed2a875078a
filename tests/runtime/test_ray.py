"""The Ray runtime on this machine's CPUs: engine replicas as actors behind the Engine
interface; a killed worker's in-flight requests are re-queued and nothing is lost."""

import os

import pytest

ray = pytest.importorskip("ray")

from reroll.config import load_config  # noqa: E402
from reroll.rollout import Example, SamplingParams, new_group  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(tmp), configure_logging=False)
    yield
    ray.shutdown()


def test_killed_engine_worker_requests_are_requeued(ray_session, tiny_dir):
    from reroll.runtime.ray import RayEnginePool

    pool = RayEnginePool(tiny_dir, workers=2, max_batch=16)
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


def test_train_runs_on_ray_engine_workers(ray_session, tmp_path):
    from reroll.loop import train
    from reroll.runlog import read_metrics

    cfg = load_config(None, ["model.max_position=32", "task.args.digits=1",
                             "task.args.n_train=80", "task.args.n_test=20",
                             "rollout.group_size=4", "rollout.batch_groups=4",
                             "rollout.max_new_tokens=4", "reward.workers=0",
                             "runtime.kind=ray", "runtime.engine_workers=2",
                             "runtime.max_staleness=1", "train.steps=3", "runtime.threads=1", "log_every=1",
                             f"out_dir={tmp_path}"])
    train(cfg, progress=False)
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3] and rows[-1]["pipeline/consumed"] == 12
