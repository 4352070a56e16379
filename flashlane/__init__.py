"""flashlane: continuous batching with exact drafting for Flash Next (qwen4_exp)."""

from flashlane.request import FinishReason, RequestOutput, RequestStats, SamplingParams

__version__ = "0.1.0"
__all__ = ["LLM", "AsyncEngine", "FinishReason", "RequestOutput", "RequestStats", "SamplingParams"]


def __getattr__(name: str):
    # torch-heavy surfaces load on first use, so `import flashlane` stays light
    if name == "LLM":
        from flashlane.llm import LLM

        return LLM
    if name == "AsyncEngine":
        from flashlane.server.engine_thread import AsyncEngine

        return AsyncEngine
    raise AttributeError(name)
