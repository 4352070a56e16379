"""The GPU tests' models: a tiny oracle checkpoint by name, or a random "-4l" preset (real
per-layer dimensions), in bf16 on the GPU with the Triton kernels."""

import torch

from flashlane.kernels import select_kernels
from flashlane.models.loader import load_checkpoint
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random


def gpu_model_named(name: str, oracle_by_name) -> tuple:
    """(config, model) of `name` on the GPU with the Triton kernels, no graphs."""
    if name.endswith("-4l"):
        cfg, model = build_random(preset(name), torch.bfloat16, "cuda", seed=1)
    else:
        cfg, model = load_checkpoint(oracle_by_name(name), dtype=torch.bfloat16, device="cuda")
    kernels = select_kernels("cuda")
    assert kernels.name == "triton"
    model.use_kernels(kernels)
    return cfg, model
