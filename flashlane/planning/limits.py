"""The ceiling and the prompt cache's budget: a flag, FLASHNEXT_LOAD_LIMIT_GB, or a share of the
GPU's memory or of RAM. All sizes are GiB (2**30 bytes), whatever a flag says."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from flashlane.planning.buffers import GIB

LIMIT_ENV = "FLASHNEXT_LOAD_LIMIT_GB"
GPU_FRACTION = 0.9  # default ceiling: of the GPU's total memory, or higher (GPU_RESERVE_GB)
# What the plan does not count stays outside the ceiling: the CUDA context, cuBLAS's and
# Triton's workspaces, the allocator's slack (2.07 GiB reserved unallocated in the one
# out-of-memory report we have, results/alone_replay_h200_f877379.log). These do not grow
# with the GPU: the default keeps 10% or GPU_RESERVE_GB out, whichever is less (an H200's
# 139.8 GiB: 134.8).
GPU_RESERVE_GB = 5.0
RAM_FRACTION = 0.7  # of RAM, for a CPU model and for host memory holding a GPU model's table
# The prompt cache's default budget per device, at most PROMPT_CACHE_SHARE of the limit.
PROMPT_CACHE_GB = {"cuda": 4.0, "cpu": 1.0}
PROMPT_CACHE_SHARE = 0.125
# and by default at most 1 / PROMPT_CACHE_ROOM of what the weights and workspace leave: a big
# model's sessions first (the real Flash Next in FP8 on an H200 leaves ~4.6 GiB)
PROMPT_CACHE_ROOM = 4


def parse_limit_gb(text: str | float) -> float:
    """`--memory-limit-gb` / FLASHNEXT_LOAD_LIMIT_GB: a positive number of GiB."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"--memory-limit-gb must be a number of GiB, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"--memory-limit-gb must be a positive number of GiB, got {text!r}")
    return value


def read_ram_bytes(meminfo: str | Path = "/proc/meminfo") -> int:
    """MemTotal from /proc/meminfo, in bytes."""
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"{meminfo}: no MemTotal line")


def resolve_limit_bytes(
    flag: str | float | None,
    env: Mapping[str, str],
    device: str,
    gpu_total_bytes: int | None = None,
    ram_total_bytes: int | None = None,
) -> int:
    """The ceiling: the flag, else FLASHNEXT_LOAD_LIMIT_GB, else the GPU's memory less 10%
    or GPU_RESERVE_GB, whichever is less (cuda), or 70% of RAM (cpu)."""
    given = flag if flag is not None else (env.get(LIMIT_ENV) or None)
    if given is not None:
        return int(parse_limit_gb(given) * GIB)
    if device == "cuda":
        if gpu_total_bytes is None:
            raise ValueError("the GPU's total memory is needed for the default memory limit")
        return default_gpu_limit(gpu_total_bytes)
    ram = read_ram_bytes() if ram_total_bytes is None else ram_total_bytes
    return int(ram * RAM_FRACTION)


def default_gpu_limit(gpu_total_bytes: int) -> int:
    """The default ceiling on a GPU of `gpu_total_bytes`: 90% of it, or all but
    GPU_RESERVE_GB where that is more (GPUs over 50 GiB)."""
    return max(int(gpu_total_bytes * GPU_FRACTION), gpu_total_bytes - int(GPU_RESERVE_GB * GIB))


def resolve_prompt_cache_bytes(gb: float | None, device: str, limit_bytes: int) -> int:
    """--prompt-cache-gb, or the device's default (PROMPT_CACHE_GB, at most PROMPT_CACHE_SHARE
    of the limit); 0 disables the cache."""
    if gb is None:
        return min(int(PROMPT_CACHE_GB[device] * GIB), int(limit_bytes * PROMPT_CACHE_SHARE))
    if gb < 0:
        raise ValueError(f"--prompt-cache-gb must be 0 or more, got {gb}")
    return int(gb * GIB)
