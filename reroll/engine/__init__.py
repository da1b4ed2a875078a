"""Generation services: the Engine protocol and the default TorchEngine (continuous batching)."""

from reroll.engine.base import Engine
from reroll.engine.torch_engine import TorchEngine

__all__ = ["Engine", "TorchEngine"]
