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
    return os.environ.get("FLASHLANE_AHEAD", "1") != "0"


@triton.jit(do_not_specialize=["nbytes"])
def _ahead_kernel(w_ptr, nbytes, CHUNK: tl.constexpr, CHUNKS: tl.constexpr, PDL: tl.constexpr):
    enter(PDL)  # after the kernel before it: the prefetches land behind its reads
    start = (tl.program_id(0) * CHUNKS + tl.arange(0, CHUNKS)).to(tl.int64) * CHUNK
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


def ahead(w: torch.Tensor | Fp8Weight) -> None:
    """Prefetch the weight w (bf16 [N, K], or an Fp8Weight's e4m3 bytes) into L2 in one
    launch after the kernel before it (module docstring); nothing where it cannot run."""
    q = w.q if isinstance(w, Fp8Weight) else w
    if q.device.type != "cuda" or not ahead_enabled() or not q.is_contiguous():
        return
    opts = pdl(q.device)
    nbytes = q.numel() * q.element_size()
    if not opts or q.data_ptr() % 16 or nbytes % 16 or nbytes == 0:
        return
    grid = (triton.cdiv(nbytes, _CHUNK * _CHUNKS),)
    _ahead_kernel[grid](
        q.view(torch.uint8), nbytes, CHUNK=_CHUNK, CHUNKS=_CHUNKS, num_warps=4, **opts
    )
