"""The runtime tests' Ray session (`ray_session`), shared by the modules that start actors."""

import os

import pytest


@pytest.fixture(scope="module")
def ray_session(tmp_path_factory, device):
    """Ray on this machine, for one test module: 2 CPUs, no dashboard."""
    import ray

    tmp = tmp_path_factory.mktemp("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # as `init_ray` sets it
    # on the CPU one logical GPU, so that GPU reservations are placed as on a GPU node: Ray
    # hands out its id and sets CUDA_VISIBLE_DEVICES to it. Its id, 99, names no real device,
    # so torch in the actors sees none even on a GPU host. On CUDA, the GPUs Ray finds.
    gpus, visible = {}, os.environ.get("CUDA_VISIBLE_DEVICES")
    if device.type == "cpu":
        gpus, os.environ["CUDA_VISIBLE_DEVICES"] = {"num_gpus": 1}, "99"
    try:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 _temp_dir=str(tmp), configure_logging=False, **gpus)
    finally:  # the raylet took its environment; this process keeps the suite's
        if visible is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = visible
    yield
    ray.shutdown()
