"""What a model's weights take in bytes: by parameter count at one element size, or as a
block-FP8 checkpoint stores them. Imports torch only inside fp8_bytes (a meta-device model):
the memory plan and `flashlane info` need none."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flashlane.models.census import count_params
from flashlane.models.config import ModelConfig

if TYPE_CHECKING:
    from flashlane.models.fp8 import QuantSpec


def weight_bytes(cfg: ModelConfig, param_bytes: int, table: bool = True, mtp: bool = True) -> int:
    """Bytes of the weights flashlane loads onto one device: text, the n-gram table when it
    lives there (a GPU model may keep it in host memory), the MTP head when drafting."""
    counts = count_params(cfg)
    params = counts.text + (counts.ngram_table if table else 0) + (counts.mtp if mtp else 0)
    return params * param_bytes


@dataclass(frozen=True, slots=True)
class Fp8Bytes:
    """The loaded weights (text + table + MTP) of a block-FP8 checkpoint."""

    quantized: int  # values stored in e4m3, one byte each
    scales: int  # float32 scale_inv entries, four bytes each
    other: int  # values the quantization_config leaves unquantized (bf16, two bytes each)

    @property
    def total_bytes(self) -> int:
        return self.quantized + 4 * self.scales + 2 * self.other


def fp8_bytes(cfg: ModelConfig, quant: QuantSpec) -> Fp8Bytes:
    """Which of cfg's parameters a block-FP8 checkpoint with quant's rules stores in e4m3:
    the 2-D linear weights (each expert's apart) its modules_to_not_convert leaves, under the
    checkpoint's names (Qwen3-Next's fused GDN projections are counted as the four they load
    as, which moves a few edge scales only). Imports torch (a meta-device model)."""
    import torch

    from flashlane.models.build import build_model
    from flashlane.models.fp8 import scale_shape

    with torch.device("meta"):
        model = build_model(cfg)
    quantized = scales = other = 0
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            continue  # the n-gram hash's int buffers, not weights
        hf = name if name.startswith(("lm_head.", "mtp.")) else "model." + name
        expert = ".experts." in name and t.ndim == 3
        if expert:  # stored per expert: experts.<e>.<proj>.weight
            base, proj = hf.rsplit(".", 1)
            hf = f"{base}.0.{proj}.weight"
        # a multimodal checkpoint's patterns name model.language_model.*: either spelling
        nested = hf.replace("model.", "model.language_model.", 1)
        if (t.ndim == 2 or expert) and quant.is_converted(hf) and quant.is_converted(nested):
            quantized += t.numel()
            scales += math.prod(scale_shape(tuple(t.shape), quant.block))
        else:
            other += t.numel()
    return Fp8Bytes(quantized, scales, other)
