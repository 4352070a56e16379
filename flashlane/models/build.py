"""The model of a config's family: FlashNext for qwen4_exp, Qwen3Hybrid for its siblings."""

from __future__ import annotations

from torch import nn

from flashlane.models.config import ModelConfig


def build_model(cfg: ModelConfig) -> nn.Module:
    """An empty model of cfg's family (parameters as the current torch device makes them)."""
    if cfg.family == "flashnext":
        from flashlane.models.flashnext import FlashNext

        return FlashNext(cfg)
    from flashlane.models.qwen3 import Qwen3Hybrid

    return Qwen3Hybrid(cfg)
