"""Weights built in expandable CUDA segments.

The full-size model's weights fill most of an H200 (FP8 Flash Next: 121 GiB of 139.8), and
their build draws fp32 transients and small scale tensors between the large stacks. With
fixed-size segments the memory those free is left in pieces too small for the next large
tensor (the MoE's `stack()`, which appends the shared expert to the routed ones, then fails
with gigabytes free); expandable segments map memory page by page, so a free stretch goes
back and is remapped whole. Only the weights' build and stacking run so: the engine's later
allocations (sessions, CUDA graph pools) keep PyTorch's default segments. A setting in
PYTORCH_CUDA_ALLOC_CONF wins: nothing is switched then.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def _setter():
    """torch's allocator-settings call (its newer name first: the older one warns in 2.11)."""
    return getattr(torch._C, "_accelerator_setAllocatorSettings", None) or getattr(
        torch.cuda.memory, "_set_allocator_settings", None
    )


def _switchable(device) -> bool:
    return (
        torch.device(device).type == "cuda"
        and "expandable_segments" not in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
        and _setter() is not None
    )


@contextmanager
def expandable_segments(device) -> Iterator[None]:
    """Within: new CUDA segments are expandable (on CUDA, unless the user set the option)."""
    if not _switchable(device):
        yield
        return
    _setter()("expandable_segments:True")
    try:
        yield
    finally:
        _setter()("expandable_segments:False")
