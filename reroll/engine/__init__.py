"""Generation services: the Engine protocols, the async EngineService, the default TorchEngine
(continuous batching), the `ENGINES` registry (``engine.name``: step-wise cores, and
``openai``, an asynchronous engine over HTTP marked ``remote``) and the `SERVERS` registry of
the server adapters it speaks through (``engine.server``)."""

from reroll.engine import reroll_adapter, sglang_adapter, vllm_adapter  # noqa: F401 (SERVERS)
from reroll.engine.adapters import SERVERS
from reroll.engine.base import ENGINES, Engine, EngineCore
from reroll.engine.service import EngineService
from reroll.engine.torch_engine import TorchEngine


@ENGINES.register("torch", ranges={"max_batch": "[1, inf)", "version": "[0, inf)"})
def torch_engine(model, tokenizer, *, max_batch: int = 64, version: int = 0) -> TorchEngine:
    """Continuous batching over a KV cache in this process (CPU or GPU)."""
    return TorchEngine(model.eval(), tokenizer, max_batch=max_batch, version=version)


@ENGINES.register("openai", remote=True, ranges={"timeout_s": "(0, inf)", "version": "[0, inf)"})
def openai_engine(model, tokenizer, *, version: int = 0, base_url: str | list[str] = "",
                  server: str = "reroll", api_key: str = "", timeout_s: float = 600.0,
                  weights_dir: str = ""):
    """OpenAI-compatible servers over HTTP (`reroll serve`, vLLM, SGLang: ``server``), one
    or several (``base_url``); ``model`` only lends its config to weights written to disk."""
    try:
        from reroll.engine.openai import OpenAIEngine
    except ImportError as e:  # httpx comes with the serve extra
        from reroll.errors import ConfigError

        raise ConfigError(f"engine.name = \"openai\" needs the serve extra ({e}): pip install "
                          f"-e '.[serve]'") from None

    return OpenAIEngine(base_url, server=server, api_key=api_key, tokenizer=tokenizer,
                        version=version, timeout_s=timeout_s, weights_dir=weights_dir,
                        model_config=getattr(model, "config", None))


def as_engine(built, threads: int = 0) -> Engine:
    """The asynchronous `Engine` for what an `ENGINES` builder returned: a step-wise core
    decodes behind an `EngineService` (its thread at ``threads`` torch threads, 0: the
    caller's); an engine that is asynchronous itself (OpenAIEngine) is used as it is."""
    return EngineService(built, threads=threads) if hasattr(built, "step") else built


__all__ = ["ENGINES", "SERVERS", "Engine", "EngineCore", "EngineService", "TorchEngine",
           "as_engine"]
