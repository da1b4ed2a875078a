"""Placing Ray actors on a cluster's GPUs without starting Ray: an actor's reservation must
fit on one node, and fractional requests pack as Ray places them (the cluster view is
stubbed)."""

import pytest

pytest.importorskip("ray")

from test_ray import equiv_cfg  # noqa: E402  (the Ray tests' small run config)

pytestmark = pytest.mark.ray


def test_one_actors_gpus_must_fit_on_one_node(tmp_path, monkeypatch):
    """Two nodes of 1 GPU each: 2 GPUs in the cluster, but an actor's reservation is on one
    node, so trainer_gpus = 2 is refused naming the largest node, and 1 + 1 fits. The
    cluster view is stubbed (no Ray started); the error is a ConfigError, so the CLI reports
    it as a config error (exit code 2)."""
    from reroll.config import ConfigError
    from reroll.runtime import ray_placement

    monkeypatch.setattr(ray_placement.ray, "cluster_resources", lambda: {"GPU": 2.0})
    monkeypatch.setattr(ray_placement.ray, "nodes", lambda: [
        {"Alive": True, "Resources": {"GPU": 1.0}}, {"Alive": True, "Resources": {"GPU": 1.0}},
        {"Alive": False, "Resources": {"GPU": 8.0}}])  # a dead node counts for nothing
    two = equiv_cfg(tmp_path, "runtime.kind=ray", "runtime.trainer_gpus=2",
                    "model.device=auto", "engine.device=cpu")
    with pytest.raises(ConfigError, match=r"runtime.trainer_gpus = 2 GPUs for one actor, but "
                                          r"no node of the Ray cluster has more than 1 "):
        ray_placement.check_gpus(two)
    ray_placement.check_gpus(equiv_cfg(tmp_path, "runtime.kind=ray", "runtime.trainer_gpus=1",
                                       "runtime.engine_gpus=1", "model.device=auto"))
    three = equiv_cfg(tmp_path, "runtime.kind=ray", "runtime.trainer_gpus=1",
                      "runtime.engine_gpus=1", "runtime.engine_workers=2", "model.device=auto")
    with pytest.raises(ConfigError, match=r"= 3 GPU\(s\), but the Ray cluster has 2 GPU"):
        ray_placement.check_gpus(three)


@pytest.mark.parametrize("requests, nodes, fits", [
    ([0.5, 0.5, 0.5, 0.5], [2], True),  # two halves on each GPU
    ([0.6, 0.6, 0.6], [2], False),  # 1.8 <= 2 GPUs, but no two 0.6 share one
    ([0.7, 0.7, 0.5], [2], False),  # 0.3 left on each GPU
    ([1, 0.5, 0.5], [2], True),
    ([0.3, 1], [1], False),  # the whole GPU leaves no share
    ([2, 1], [2, 1], True),
    ([2, 2], [3, 1], False),  # 4 GPUs in all, but the second 2 finds no node with 2 free
    ([0.0, 0.0], [0], True),  # nothing reserved
])
def test_gpu_requests_pack_as_ray_places_them(requests, nodes, fits):
    from reroll.runtime.ray_placement import packs

    assert packs(requests, nodes) is fits
