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
