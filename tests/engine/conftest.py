"""Tiny 4-layer Llama and Qwen2 models for the engine tests (weights spread out, see
engine_helpers.spread), on ``--device``."""

import pytest
from engine_helpers import spread

from reroll.config import ModelConfig
from reroll.models import build_tiny, load


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def arch_dir(request, tmp_path_factory):
    cfg = ModelConfig(arch=request.param, hidden_size=64, num_layers=4, num_heads=4,
                      num_kv_heads=2, intermediate_size=128)
    return build_tiny(cfg, tmp_path_factory.mktemp(request.param), seed=0)


@pytest.fixture()
def lm(arch_dir, device):
    """(model, tokenizer) with spread-out weights (drawn on the CPU, so the same on every
    device), on ``device``, fresh for each test."""
    model, tok = load(arch_dir)
    spread(model, seed=7)
    return model.to(device).eval(), tok
