"""A weight read into L2 on a side branch of the step, while the step's latency-bound
kernels leave DRAM idle.

At one decode row the mixer's chain between its in projection and its out projection (the
GDN's conv, q / k norms, recurrent rule; the attention's scores, select and attention) is a
run of small kernels that read little: DRAM idles there, and the out projection after it
(31 MB at Flash Next's sizes) then pays its whole read. The caller forks a side stream after
the in projection, launches `ahead` there (bulk L2 prefetches of the weight, spread over
programs), and joins it before the out projection: the chain runs beside the read instead of
behind it. A launch in the chain itself held the chain for the whole read (f9d3909, LOG.md).
It reads only weights, which nothing in a step writes, and writes nothing: no bit changes.
CUDA only; elsewhere it launches nothing.
"""

from __future__ import annotations

import itertools

import torch
import triton
import triton.language as tl

from flashlane.kernels.linear.fp8 import Fp8Weight

__all__ = ["ahead"]

# bytes a bulk prefetch, and prefetches a program (one a thread): 31 MB in ~60 programs
_CHUNK = 4 << 10
_CHUNKS = 128


@triton.jit(do_not_specialize=["n0", "n1", "n2", "p0", "p1"])
def _ahead_kernel(w0, n0, w1, n1, w2, n2, p0, p1, CHUNK: tl.constexpr, CHUNKS: tl.constexpr):
    """Programs [0, p0) prefetch w0's n0 bytes, [p0, p1) w1's, the rest w2's."""
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
    one launch on the current stream (module docstring); a weight it cannot read in 16-byte
    pieces is left out; nothing launches off CUDA or on a GPU before Hopper."""
    if len(weights) > 3:
        raise ValueError(f"ahead: at most 3 weights a launch, got {len(weights)}")
    held = [w.q if isinstance(w, Fp8Weight) else w for w in weights]
    held = [q for q in held if q.is_contiguous() and _aligned(q)]
    if not held or held[0].device.type != "cuda":
        return
    if torch.cuda.get_device_capability(held[0].device)[0] < 9:
        return
    span = _CHUNK * _CHUNKS
    sizes = [q.numel() * q.element_size() for q in held]
    bytes_ = [q.view(torch.uint8) for q in held]
    bytes_ += [bytes_[0]] * (3 - len(held))
    sizes += [0] * (3 - len(sizes))
    ends = list(itertools.accumulate(triton.cdiv(n, span) for n in sizes))
    _ahead_kernel[(ends[2],)](
        bytes_[0], sizes[0], bytes_[1], sizes[1], bytes_[2], sizes[2], ends[0], ends[1],
        CHUNK=_CHUNK, CHUNKS=_CHUNKS, num_warps=4,
    )  # fmt: skip


def _aligned(q: torch.Tensor) -> bool:
    n = q.numel() * q.element_size()
    return n > 0 and n % 16 == 0 and q.data_ptr() % 16 == 0
