"""Generation services: the Engine protocols, the async EngineService, the default TorchEngine
(continuous batching) and the `ENGINES` registry of step-wise cores (``engine.name``)."""

from reroll.engine.base import ENGINES, Engine, EngineCore
from reroll.engine.service import EngineService
from reroll.engine.torch_engine import TorchEngine


@ENGINES.register("torch", ranges={"max_batch": "[1, inf)", "version": "[0, inf)"})
def torch_engine(model, tokenizer, *, max_batch: int = 64, version: int = 0) -> TorchEngine:
    """Continuous batching over a KV cache in this process (CPU or GPU)."""
    return TorchEngine(model.eval(), tokenizer, max_batch=max_batch, version=version)


__all__ = ["ENGINES", "Engine", "EngineCore", "EngineService", "TorchEngine"]
