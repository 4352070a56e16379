"""Programmatic dependent launch (Hopper): a kernel's programs may start while the kernel
before it in the stream still runs, so its launch and start overlap that kernel's tail.

A kernel launched with `pdl(device)`'s options takes them as its `PDL` constexpr and calls
`enter(PDL)` before it touches memory another kernel writes: `gdc_wait` returns once every
kernel before it has completed and its memory is visible, so each kernel reads and writes
exactly what it would serially, and no bit changes. `gdc_launch_dependents` then lets the
next launch be scheduled (its programs take the SMs this kernel leaves free). Before its
wait a kernel may only read memory nothing in the step writes: the linear prefetches its
weights into L2 there (`kernels/linear/prefetch.py`), so a small product's first loads no
longer wait on DRAM after the kernel before it ends.

Captured into a CUDA graph, the launches become programmatic edges. Kernels launched without
the options (torch's, fla's) keep full serialisation; a PDL kernel after one of them starts
as its programs exit and still waits for its memory. FLASHLANE_PDL=0 turns it off (the
launches are then plain, the kernels the same). Compute capability 9 and up only, never in
Triton's interpreter (CPU tensors).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

__all__ = ["enabled", "enter", "pdl"]


def enabled() -> bool:
    return os.environ.get("FLASHLANE_PDL", "1") != "0"


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl(device: torch.device) -> dict:
    """A launch's options on `device`: {PDL: 1, launch_pdl: True} where PDL runs, else {}."""
    if device.type != "cuda" or not enabled():
        return {}
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {"PDL": 1, "launch_pdl": True} if _capable(index) else {}


@triton.jit
def enter(PDL: tl.constexpr):
    """A PDL kernel's first step: wait for the kernels before it (complete, memory
    visible), then let the next launch be scheduled. Nothing when PDL is 0."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
