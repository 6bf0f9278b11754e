"""railyard: LLM serving in three scheduling layers (engine, serve, cluster)."""

__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "EngineConfig", "LoRARequest", "__version__"]


def __getattr__(name: str):
    # Lazy so that `railyard deploy ...` and `railyard plan` never import torch.
    if name == "LLM":
        from railyard.engine.llm import LLM

        return LLM
    if name == "SamplingParams":
        from railyard.engine.config import SamplingParams

        return SamplingParams
    if name == "EngineConfig":
        from railyard.engine.config import EngineConfig

        return EngineConfig
    if name == "LoRARequest":
        from railyard.engine.lora.request import LoRARequest

        return LoRARequest
    raise AttributeError(name)
