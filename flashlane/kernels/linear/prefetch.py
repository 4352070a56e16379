"""L2 prefetch of a decode product's weights under programmatic dependent launch
(`kernels/pdl.py`): a program may read, before it waits for the kernel before it, only
memory nothing in the step writes, and the weights are such memory. `prefetch_span` picks
the K values a program prefetches; `prefetch_rows` issues them. Used by `linear` and the
hyper-connection's up projection (`rowwise/triton_hc_up.py`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.linear.tiles import DECODE_ROWS

__all__ = ["prefetch_rows", "prefetch_span"]

# under programmatic dependent launch (`kernels/pdl.py`) a decode call's programs prefetch
# their weights into L2 before they wait for the kernel before them: at most this many bytes
# a launch (the H200's L2 holds 50 MB), and none when a program's share is under 128 bytes a
# row. The weights are read, never written, by every kernel of a step.
_PREFETCH_BYTES = 16 << 20
_PREFETCH_MIN = 64


@triton.jit
def prefetch_rows(w_ptr, rn, N, K, k0, count, ELEM: tl.constexpr):
    """L2 prefetch of w[rn, k0 : k0 + count] (count values, clipped at K): one bulk prefetch
    a row (the rows past N repeat row N - 1). Addresses and sizes are multiples of 16 bytes
    (`linear` checks the weight's alignment and K)."""
    rows = tl.minimum(rn, N - 1).to(tl.int64)
    addr = (w_ptr + rows * K + k0).to(tl.int64, bitcast=True)
    size = tl.zeros_like(rn) + tl.minimum(count, K - k0) * ELEM
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,r",
        [addr, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def prefetch_span(w: torch.Tensor, cfg: dict, m: int, n_tiles: int, programs_k: int) -> int:
    """The K values a program prefetches under PDL (0: none): a decode call's whole span of
    K, cut to _PREFETCH_BYTES a launch, in 16-byte multiples; none where a row's address is
    not 16-byte aligned."""
    k = w.shape[1]
    elem = w.element_size()
    if m > DECODE_ROWS or w.data_ptr() % 16 or (k * elem) % 16:
        return 0
    span = cfg["BLOCKS_PER_PART"] * cfg["BLOCK_K"] if programs_k > 1 else k
    share = _PREFETCH_BYTES // (n_tiles * cfg["BLOCK_N"] * programs_k * elem)
    ahead = min(span, share) // (16 // elem) * (16 // elem)
    return ahead if ahead >= _PREFETCH_MIN else 0
