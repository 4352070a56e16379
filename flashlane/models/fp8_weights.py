"""Where a block-FP8 model's weights stay FP8: the choice, and the model's modules made so.

`weight_format` is the one place that decides: on CUDA the linears and expert stacks a
block-FP8 checkpoint (or `--quantization fp8`) quantizes stay e4m3 with their block scales
(kernels/linear/fp8.py's Fp8Weight, read by the Triton FP8 GEMMs: half the bytes of bf16 and
the checkpoint's own values); elsewhere they are dequantized to the compute dtype at load, so
that the CPU's replies are those of the dequantized model, as before.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from flashlane.kernels.linear.fp8 import BLOCK, Fp8Weight
from flashlane.models.fp8 import SCALE_SUFFIX, QuantSpec

WeightFormat = Literal["fp8", "dequantized"]
# checkpoint names the loader cuts by rows (Qwen3-Next's fused GDN projections,
# loader.split_fused_gdn): a cut through a block of scales cannot stay FP8
_CUT_AT_LOAD = ("in_proj_qkvz.weight", "in_proj_ba.weight")


def weight_format(device: torch.device | str, spec: QuantSpec | None) -> WeightFormat:
    """ "fp8" (kept e4m3 on the device) for block-FP8 weights in 128 x 128 blocks on CUDA;
    "dequantized" otherwise (the CPU, another block size, or no FP8 weights at all)."""
    if spec is None or torch.device(device).type != "cuda" or spec.block != (BLOCK, BLOCK):
        return "dequantized"
    return "fp8"


def keeps(name: str) -> bool:
    """Whether checkpoint tensor `name` (our name, quantized) may stay FP8 under "fp8"."""
    return not name.endswith(_CUT_AT_LOAD)


def install_fp8(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """For every kept e4m3 tensor `X` of `tensors` (with `X_scale_inv`) that names a parameter
    of `model` (on the meta device), that parameter replaced by an empty Fp8Weight; returns
    the tensors under the state-dict names that then hold them (`X.q`, `X.scale_inv`). A scale
    that names no parameter is left for the loader to report."""
    params = dict(model.named_parameters())
    out = dict(tensors)
    for scale_name in [n for n in tensors if n.endswith(SCALE_SUFFIX)]:
        name = scale_name.removesuffix(SCALE_SUFFIX)
        if name not in params or name not in tensors:
            continue
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        delattr(module, attr)
        setattr(module, attr, Fp8Weight.empty(tuple(params[name].shape)))
        out[name + ".q"] = out.pop(name)
        out[name + ".scale_inv"] = out.pop(scale_name)
    return out


def install_empty_fp8(model: nn.Module, spec: QuantSpec) -> set[str]:
    """Make every parameter of `model` (on the meta device) that `spec` converts (a 2-D
    linear or an expert stack, by its checkpoint name: `model.` before the text model's, one
    expert's for a stack) an empty Fp8Weight; returns their names (the random FP8 build)."""
    names = set()
    for name, p in list(model.named_parameters()):
        hf = name if name.startswith(("lm_head.", "mtp.")) else "model." + name
        expert = ".experts." in name and p.ndim == 3
        if expert:  # stored per expert: experts.<e>.<proj>.weight
            base, proj = hf.rsplit(".", 1)
            hf = f"{base}.0.{proj}.weight"
        if (p.ndim == 2 or expert) and spec.is_converted(hf):
            owner, _, attr = name.rpartition(".")
            module = model.get_submodule(owner)
            delattr(module, attr)
            setattr(module, attr, Fp8Weight.empty(tuple(p.shape)))
            names.add(name)
    return names


def dequantize_modules(model: nn.Module, dtype: torch.dtype) -> None:
    """Every Fp8Weight of `model` replaced by a plain parameter of its values in dtype."""
    for name, w in list(fp8_weights(model).items()):
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        delattr(module, attr)
        setattr(module, attr, nn.Parameter(w.dequantize(dtype), requires_grad=False))


def fp8_weights(model: nn.Module) -> dict[str, Fp8Weight]:
    """The model's FP8 weights by their parameter's name (tests, `flashlane info`)."""
    return {n: m for n, m in model.named_modules() if isinstance(m, Fp8Weight)}
