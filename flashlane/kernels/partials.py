"""Split-K partials added in the launch that wrote them: each tile's last program adds them.

A split-K tile runs as PARTS programs, each storing its fp32 partial to a workspace. Instead of
a second kernel adding them, each program bumps its tile's counter once its partial is stored;
the one that sees PARTS - 1 (the last to arrive) reads every partial back, adds them in
ascending order, `((p0 + p1) + p2) + ...` (`add_partials`, which the second kernel uses too),
and sets the counter back to 0. Which program comes last depends on timing; what it adds does
not, so the bits are those of the two-kernel path. No atomic ever touches the data.

The counters are one zeroed int32 buffer per device, left zeroed by every launch. A CUDA graph
capture does not run a zero fill, so while capturing `counters` returns None if the buffer was
not made before, and the caller takes the two-kernel path (same bits). One stream at a time:
launches running concurrently on two streams would share counters.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# counters per device: one per tile of a launch (the split paths launch fewer than this)
NUM_COUNTERS = 4096

# device -> its counters, made outside any capture and never freed (graphs hold the address)
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def counters(device: torch.device, num_tiles: int) -> torch.Tensor | None:
    """The device's zeroed int32 counters (at least num_tiles), or None while a CUDA graph
    is captured before they exist."""
    if num_tiles > NUM_COUNTERS:
        raise ValueError(f"partials: {num_tiles} tiles, {NUM_COUNTERS} counters")
    buf = _COUNTERS.get(device)
    if buf is None and not _capturing(device):
        buf = _COUNTERS[device] = torch.zeros(NUM_COUNTERS, dtype=torch.int32, device=device)
    return buf


@triton.jit
def add_partials(ws_ptr, offs, mask, plane, PARTS: tl.constexpr, CACHE: tl.constexpr):
    """The PARTS fp32 partials at ws_ptr + p * plane + offs, added in ascending order."""
    total = tl.load(ws_ptr + offs, mask=mask, other=0.0, cache_modifier=CACHE)
    for p in tl.static_range(1, PARTS):
        part = tl.load(ws_ptr + p * plane + offs, mask=mask, other=0.0, cache_modifier=CACHE)
        total = total + part
    return total


@triton.jit
def last_to_arrive(count_ptr, PARTS):
    """True in the program that is the last of its tile's PARTS (a constexpr or a runtime
    count) to get here (partial stored).

    The barrier orders every thread's partial store before the count's release; the acquire
    makes the other programs' partials visible to the last one, which resets the counter for
    the next launch (no other program of the tile touches it again). The last one must read
    the partials through L2 (CACHE=".cg" in `add_partials`): its L1 is not coherent."""
    tl.debug_barrier()
    old = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
    is_last = old == PARTS - 1
    if is_last:
        tl.store(count_ptr, 0)
    tl.debug_barrier()
    return is_last
