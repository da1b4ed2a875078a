import pytest
import torch

torch.set_num_threads(1)


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
def small_run():
    """``small_run(out_dir, *overrides)``: the config of a tiny RL run (1-digit sums, 4 groups
    of 4 samples, 4 new tokens) that trains a step in well under a second. The reward is "a
    digit anywhere in the completion", so an untrained model gets a gradient every step."""
    from reroll.config import load_config

    base = ["model.max_position=32", "task.args.digits=1", "task.args.n_train=80",
            "task.args.n_test=20", "rollout.group_size=4", "rollout.batch_groups=4",
            "rollout.max_new_tokens=4", "reward.workers=0", "log_every=1", "train.lr=3e-4",
            "runtime.threads=1",
            'reward.verifiers=[{name="format", args={pattern="[0-9]", fullmatch=false}}]']
    return lambda out, *extra: load_config(None, base + [f"out_dir={out}", *extra])
