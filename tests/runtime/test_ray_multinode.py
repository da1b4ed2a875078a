"""The Ray runtime across nodes: a `ray.cluster_utils.Cluster` of three raylets on this
machine (a head without GPUs and two nodes with one logical GPU each), the trainer actor and
the engine actor each reserving a whole GPU, so Ray must put them on different nodes and the
weights travel between nodes through the object store. The run still ends bitwise equal to
the local run."""

import os

import pytest

ray = pytest.importorskip("ray")

from test_ray import EQUIV, assert_bitwise_equal, final_weights  # noqa: E402  (same directory)

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, device):
    if device.type != "cpu":
        pytest.skip("logical GPUs stand for the nodes' GPUs only on a CPU host")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # as `init_ray` sets it
    tmp = str(tmp_path_factory.mktemp("cluster"))
    os.makedirs(os.path.join(tmp, "ray"))  # where Ray writes the cluster's address
    saved = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "RAY_TMPDIR")}
    os.environ["CUDA_VISIBLE_DEVICES"] = "99"  # the logical GPUs name no real device
    os.environ["RAY_TMPDIR"] = tmp  # the cluster's address file too, not the shared /tmp/ray
    try:
        c = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "num_gpus": 0, "include_dashboard": False, "temp_dir": tmp})
        nodes = [c.add_node(num_cpus=1, num_gpus=1) for _ in range(2)]
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
    finally:  # the raylets took their environment; this process keeps the suite's
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    yield c, nodes
    ray.shutdown()
    c.shutdown()


def test_engine_and_trainer_on_different_nodes_equal_the_local_run(cluster, tmp_path):
    from reroll.config_checks import load_checked
    from reroll.runtime import ray as rr
    from reroll.runtime import train

    _, nodes = cluster
    seen, real = {}, rr.components

    def spy(cfg, init_dir, ckpt, tok, task):
        parts = real(cfg, init_dir, ckpt, tok, task)
        seen["trainer"] = parts.trainer.placement()
        seen["engines"] = parts.engine_core.placement()
        return parts

    rr.components = spy
    try:
        train(load_checked(None, EQUIV + [f"out_dir={tmp_path / 'ray'}", "runtime.kind=ray",
                                          "train.steps=3", "runtime.trainer_gpus=1",
                                          "runtime.engine_gpus=1", "model.device=auto"]),
              progress=False)
    finally:
        rr.components = real
    train(load_checked(None, EQUIV + [f"out_dir={tmp_path / 'local'}", "model.device=cpu",
                                      "train.steps=3"]), progress=False)
    trainer, (engine,) = seen["trainer"], seen["engines"]
    gpu_nodes = {n.node_id for n in nodes}
    assert trainer["node_id"] in gpu_nodes and engine["node_id"] in gpu_nodes
    assert trainer["node_id"] != engine["node_id"]  # weights crossed between nodes
    assert_bitwise_equal(final_weights(tmp_path / "ray"), final_weights(tmp_path / "local"))
