"""A weight read ahead into L2, in its own small launch, while the step's latency-bound
kernels leave DRAM idle.

At one decode row the mixer's chain between its in projection and its out projection (the
GDN's gates, conv, q / k norms, recurrent rule and gated norm; the attention's scores,
select and attention) is a run of small kernels that read little: DRAM idles there, and the
out projection after it (31 MB at Flash Next's sizes) then pays its whole read. `ahead`
launched right after the in projection waits for it (PDL: `enter`), lets the chain launch,
and issues bulk L2 prefetches of the out projection's weight, which stream in while the
chain runs. It reads only weights, which nothing in a step writes, and writes nothing: no bit
changes. CUDA under PDL only (kernels/pdl.py); elsewhere, and where FLASHLANE_AHEAD=0, it
launches nothing.
"""

from __future__ import annotations

import itertools
import os

import torch
import triton
import triton.language as tl

from flashlane.kernels.linear.fp8 import Fp8Weight
from flashlane.kernels.pdl import enter, pdl

__all__ = ["ahead", "ahead_enabled"]

# bytes a bulk prefetch, and prefetches a program (one a thread)
_CHUNK = 32 << 10
_CHUNKS = 128


def ahead_enabled() -> bool:
    """FLASHLANE_AHEAD=0 turns the read ahead off (runner/lone_state.py: 2 reads the MLP's
    hyper-connection weights too)."""
    return os.environ.get("FLASHLANE_AHEAD", "1") != "0"


@triton.jit(do_not_specialize=["n0", "n1", "n2", "p0", "p1"])
def _ahead_kernel(
    w0, n0, w1, n1, w2, n2, p0, p1, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, PDL: tl.constexpr
):
    """Programs [0, p0) prefetch w0's n0 bytes, [p0, p1) w1's, the rest w2's."""
    enter(PDL)  # after the kernel before it: the prefetches land behind its reads
    pid = tl.program_id(0)
    if pid < p0:
        w_ptr, nbytes, first = w0, n0, 0
    elif pid < p1:
        w_ptr, nbytes, first = w1, n1, p0
    else:
        w_ptr, nbytes, first = w2, n2, p1
    start = ((pid - first) * CHUNKS + tl.arange(0, CHUNKS)).to(tl.int64) * CHUNK
    live = start < nbytes
    size = tl.where(live, tl.minimum(nbytes - start, CHUNK), 16).to(tl.int32)
    addr = (w_ptr + tl.where(live, start, 0)).to(tl.int64, bitcast=True)  # w_ptr: bytes
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,r",
        [addr, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def ahead(*weights: torch.Tensor | Fp8Weight) -> None:
    """Prefetch up to three weights (bf16 [N, K], or an Fp8Weight's e4m3 bytes) into L2 in
    one launch after the kernel before it (module docstring); a weight it cannot read in
    16-byte pieces is left out; nothing launches where it cannot run."""
    if len(weights) > 3:
        raise ValueError(f"ahead: at most 3 weights a launch, got {len(weights)}")
    held = [w.q if isinstance(w, Fp8Weight) else w for w in weights]
    held = [q for q in held if q.is_contiguous() and _aligned(q)]
    if not held or held[0].device.type != "cuda" or not ahead_enabled():
        return
    opts = pdl(held[0].device)
    if not opts:
        return
    span = _CHUNK * _CHUNKS
    sizes = [q.numel() * q.element_size() for q in held]
    bytes_ = [q.view(torch.uint8) for q in held]
    bytes_ += [bytes_[0]] * (3 - len(held))
    sizes += [0] * (3 - len(sizes))
    ends = list(itertools.accumulate(triton.cdiv(n, span) for n in sizes))
    _ahead_kernel[(ends[2],)](
        bytes_[0], sizes[0], bytes_[1], sizes[1], bytes_[2], sizes[2], ends[0], ends[1],
        CHUNK=_CHUNK, CHUNKS=_CHUNKS, num_warps=4, **opts,
    )  # fmt: skip


def _aligned(q: torch.Tensor) -> bool:
    n = q.numel() * q.element_size()
    return n > 0 and n % 16 == 0 and q.data_ptr() % 16 == 0
