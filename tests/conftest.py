import os

import pytest
import torch

torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption(
        "--device", default=os.environ.get("REROLL_TEST_DEVICE", "cpu"),
        help="torch device the engine, trainer and run tests put their models on: cpu (the "
             "default), cuda or cuda:N (also REROLL_TEST_DEVICE)")


def pytest_configure(config):
    name = config.getoption("device")
    try:
        dev = torch.device(name)
    except RuntimeError as e:
        raise pytest.UsageError(f"--device {name!r}: {e}") from None
    if dev.type not in ("cpu", "cuda"):
        raise pytest.UsageError(f"--device must be cpu, cuda or cuda:N, got {name!r}")
    # set before CUDA is first used (nothing has, yet), for this process and its children
    # (run subprocesses, Ray workers), so that runs left at model.device=auto go there too
    if dev.type == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif dev.index is not None:  # cuda:N is the only GPU the suite sees, as "cuda"
        shown = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [x for x in shown.split(",") if x.strip()] if shown is not None else None
        if ids is not None and dev.index >= len(ids):
            raise pytest.UsageError(f"--device {name!r}: CUDA_VISIBLE_DEVICES={shown!r}")
        os.environ["CUDA_VISIBLE_DEVICES"] = ids[dev.index] if ids else str(dev.index)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise pytest.UsageError(f"--device {name!r}: torch sees no CUDA device")
        # float32 references and bitwise-equal runs: no TF32, and the deterministic kernels
        # where CUDA has them, in this process (runs on `on_device` set them in theirs, Ray
        # actors included); ops without one, e.g. cumsum, warn instead of failing
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)


@pytest.fixture(scope="session")
def device(pytestconfig) -> torch.device:
    """The device of ``--device`` (cpu unless asked): models under test go there. cuda:N is
    "cuda" here, the one GPU the suite sees."""
    return torch.device(torch.device(pytestconfig.getoption("device")).type)


@pytest.fixture(scope="session")
def on_device(device) -> list[str]:
    """Config overrides that put a run on ``--device``: on CUDA with runtime.deterministic,
    so that runs compared bit for bit use the same kernels in every process."""
    return [f"model.device={device}"] + (["runtime.deterministic=true"]
                                         if device.type == "cuda" else [])


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A 0.4M-parameter Qwen2 + char tokenizer saved with save_pretrained (random init)."""
    from reroll.config import ModelConfig
    from reroll.models import build_tiny

    return build_tiny(ModelConfig(), tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture()
def tiny(tiny_dir):
    from reroll.models import load

    return load(tiny_dir)


@pytest.fixture()
def small_run(on_device):
    """``small_run(out_dir, *overrides)``: the config of a tiny RL run (1-digit sums, 4 groups
    of 4 samples, 4 new tokens) that trains a step in well under a second. The reward is "a
    digit anywhere in the completion", so an untrained model gets a gradient every step.
    The run's models go on ``--device``."""
    from reroll.config_checks import load_checked

    base = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
            "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
            "rollout.max_new_tokens=4", "reward.workers=0", "log_every=1", "train.lr=3e-4",
            "runtime.threads=1",
            'reward.verifiers=[{name="format", args={pattern="[0-9]", fullmatch=false}}]']
    return lambda out, *extra: load_checked(None, base + [f"out_dir={out}", *on_device, *extra])


@pytest.fixture(scope="module")
def benchmarks_on_path():
    """benchmarks/ on sys.path for one test module (a benchmark script imports its siblings,
    such as benchmarks/machine.py, by name)."""
    from pathlib import Path

    mp = pytest.MonkeyPatch()
    mp.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    yield
    mp.undo()
