"""runtime.deterministic: the process (and each Ray actor, through the same function) gets
torch's deterministic kernels, as TrainingArguments.full_determinism sets them; off by
default, and a resume may switch it (it picks kernels, not what is learned)."""

import os

import pytest
import torch

from reroll import build
from reroll.config_checks import load_checked
from reroll.runlog import config_diff


def _flags():
    return (torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)


@pytest.fixture()
def restored(monkeypatch):
    """The process-wide settings a run changes, put back afterwards."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before, threads = _flags(), torch.get_num_threads()
    yield before
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[2:]
    torch.set_num_threads(threads)


def test_deterministic_kernels_are_set_only_when_asked(restored):
    build.prepare_process(load_checked(None, ["runtime.threads=1"]))
    assert _flags() == restored and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    build.prepare_process(load_checked(None, ["runtime.threads=1", "runtime.deterministic=true"]))
    # warn-only: ops with no deterministic CUDA kernel (top-p's cumsum) still run
    assert _flags() == (True, True, True, False)
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_a_deterministic_run_on_the_cpu_equals_the_default_run_bitwise(restored, tmp_path,
                                                                       small_run):
    """CPU kernels are deterministic already: the switch changes no number there."""
    from safetensors.torch import load_file

    from reroll.runtime import train

    for name, extra in (("plain", []), ("det", ["runtime.deterministic=true"])):
        train(small_run(tmp_path / name, "train.steps=3", "eval.every=0", *extra),
              progress=False)
    a, b = (load_file(tmp_path / n / "checkpoints" / "step_000003" / "model" /
                      "model.safetensors") for n in ("plain", "det"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resume_may_switch_deterministic_kernels():
    assert config_diff({"runtime": {"deterministic": False}},
                       {"runtime": {"deterministic": True}}) == []
