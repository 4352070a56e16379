"""Prompt tiles' operands through TMA descriptors (Hopper's tensor memory accelerator): the
dense linear's x and w (kernels/linear/triton.py) and the experts' weights
(kernels/moe/triton_pairs.py `described`) loaded a block at a time by TMA, out of bounds as
zeros, the values the masked pointer loads give; the tiles, K order and dots are the same,
so are the bits. PROMPT: on or off (FLASHLANE_TMA=1: on, an experiment's switch until a
GPU has timed it side by side, scripts/gpu_check.sh `env-ab`)."""

from __future__ import annotations

import os

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

PROMPT = os.environ.get("FLASHLANE_TMA", "0") == "1"


def able(*tensors: torch.Tensor) -> bool:
    """PROMPT is on, the device has TMA (compute capability 9 or more; or the interpreter's
    CPU), and each 2-D operand's base and row stride are 16-byte multiples."""
    dev = tensors[0].device
    if not PROMPT or (dev.type != "cpu" and torch.cuda.get_device_capability(dev)[0] < 9):
        return False
    return all(
        t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0 and t.stride(-1) == 1
        for t in tensors
    )


def described(t: torch.Tensor, block: list[int]) -> TensorDescriptor:
    """A descriptor of 2-D t (rows strided, columns contiguous) in blocks of `block`."""
    return TensorDescriptor(t, list(t.shape), [t.stride(0), 1], block)


def linear_operands(x: torch.Tensor, w: torch.Tensor, cfg: dict, prompt: bool):
    """linear's (x [M, K], w [N, K]) for a tile config: descriptors in its (BLOCK_M, BLOCK_K)
    and (BLOCK_N, BLOCK_K) blocks and True where `prompt` (all partitions in one program,
    more rows than a decode tile, 16-bit products) and `able`; else as they are and False."""
    if not (prompt and able(x, w)):
        return x, w, False
    bk = cfg["BLOCK_K"]
    return described(x, [cfg["BLOCK_M"], bk]), described(w, [cfg["BLOCK_N"], bk]), True
