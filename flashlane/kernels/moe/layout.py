"""The expert-sorted layout of a prompt's many (row, slot) pairs in three launches
(`routing.dispatch`'s contract, its tensors bit for bit): where ~48 torch launches with a
radix sort took ~0.4 ms a MoE layer of an 8k prefill on the H200, and their host time left
the GPU idle ~150 us before each layer's experts (timeline_prefill_8192_*_5f386bc_*.txt).

* count, grid (chunks,): each chunk of LAYOUT_CHUNK pairs counts its pairs by expert, and
  clears its stripe of the slots to -1;
* offsets, one program: each expert's padded segment (blocks of block_m), each chunk's first
  slot in it (the segment's start plus the earlier chunks' counts), every block's expert
  (-1 past the used ones), the shared expert's blocks and slots;
* place, grid (chunks,): each chunk walks its pairs in order from its first slots, a pair's
  rank among its chunk's earlier pairs of its expert added (`place_step`): stable, as the
  sort was. (The one-program layout of a decode round's few pairs sorts them instead:
  routing._layout.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.pdl import enter, pdl

# pairs a program of the count and place launches takes
LAYOUT_CHUNK = 1024
# pairs a step of a chunk's walk ([STEP, experts] one-hot tiles)
STEP = 16
# slots a store clears or fills
CLEAR = 1024
# blocks an offsets step labels ([LABELS, experts] comparisons)
LABELS = 64


@triton.jit
def place_step(ids_ptr, slot_pair_ptr, p0, end, b_next, o_p, o_e, CACHE: tl.constexpr):
    """Pairs p0 .. p0 + len(o_p) (those before `end`) stored at their experts' next free slots
    b_next plus their rank among this step's earlier pairs of the same expert -> (their
    experts, their slots, which are real); the caller adds the step's histogram to b_next."""
    mask_p = p0 + o_p < end
    # a masked pair reads expert 0: never stored, and after every real pair of the step
    b_e = tl.load(ids_ptr + p0 + o_p, mask=mask_p, other=0, cache_modifier=CACHE).to(tl.int32)
    is_e = b_e[:, None] == o_e[None, :]
    mates = (b_e[:, None] == b_e[None, :]) & (o_p[None, :] < o_p[:, None])
    # b_next of each pair's expert (a one-hot sum gathers from registers), plus its rank
    b_dest = tl.sum(tl.where(is_e, b_next[None, :], 0), axis=1)
    b_dest += tl.sum(mates.to(tl.int32), axis=1)
    tl.store(slot_pair_ptr + b_dest, p0 + o_p, mask=mask_p)
    return b_e, b_dest, mask_p


@triton.jit(do_not_specialize=["num_pairs", "num_slots", "stripe"])
def _count_kernel(
    ids_ptr, counts_ptr, slot_pair_ptr, num_pairs, num_slots, stripe,
    BLOCK_E: tl.constexpr, CHUNK: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    c = tl.program_id(0)
    o = c * CHUNK + tl.arange(0, CHUNK)
    m = o < num_pairs
    b_e = tl.load(ids_ptr + o, mask=m, other=0).to(tl.int32)
    o_e = tl.arange(0, BLOCK_E)
    tl.store(counts_ptr + c * BLOCK_E + o_e, tl.histogram(b_e, BLOCK_E, mask=m))
    o_c = tl.arange(0, BLOCK_C)
    lo = c * stripe
    hi = tl.minimum(lo + stripe, num_slots)
    for s0 in range(lo, hi, BLOCK_C):
        tl.store(slot_pair_ptr + s0 + o_c, -1, mask=s0 + o_c < hi)


@triton.jit(do_not_specialize=["num_pairs", "chunks", "routed_blocks", "shared_rows"])
def _offsets_kernel(
    counts_ptr, base_ptr, slot_pair_ptr, block_expert_ptr, num_pairs, chunks, routed_blocks,
    shared_rows, E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_C: tl.constexpr, BLOCK_B: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    enter(PDL)
    o_e = tl.arange(0, BLOCK_E)
    total = tl.zeros([BLOCK_E], dtype=tl.int32)
    for c in range(chunks):
        total += tl.load(counts_ptr + c * BLOCK_E + o_e)
    blocks = (total + BLOCK_M - 1) // BLOCK_M
    end = tl.cumsum(blocks, axis=0)
    run = (end - blocks) * BLOCK_M
    for c in range(chunks):
        tl.store(base_ptr + c * BLOCK_E + o_e, run)
        run += tl.load(counts_ptr + c * BLOCK_E + o_e)
    # a block's expert: how many segments end at or before it (the experts past E end with
    # the last, so a block past every segment counts them too: -1)
    o_c = tl.arange(0, BLOCK_B)
    for b0 in range(0, routed_blocks, BLOCK_B):
        b = b0 + o_c
        ex = tl.sum((end[None, :] <= b[:, None]).to(tl.int32), axis=1)
        tl.store(block_expert_ptr + b, tl.where(ex < E, ex, -1), mask=b < routed_blocks)
    # the shared expert (id E): row r's pair num_pairs + r, in blocks after the routed ones
    shared_blocks = (shared_rows + BLOCK_M - 1) // BLOCK_M
    for b0 in range(0, shared_blocks, BLOCK_B):
        b = b0 + o_c
        tl.store(block_expert_ptr + routed_blocks + b, E, mask=b < shared_blocks)
    o_s = tl.arange(0, BLOCK_C)
    for s0 in range(0, shared_blocks * BLOCK_M, BLOCK_C):
        s = s0 + o_s
        pair = tl.where(s < shared_rows, num_pairs + s, -1)
        tl.store(
            slot_pair_ptr + routed_blocks * BLOCK_M + s, pair, mask=s < shared_blocks * BLOCK_M
        )


@triton.jit(do_not_specialize=["num_pairs"])
def _place_kernel(
    ids_ptr, base_ptr, slot_pair_ptr, num_pairs,
    BLOCK_E: tl.constexpr, CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    enter(PDL)
    c = tl.program_id(0)
    o_e = tl.arange(0, BLOCK_E)
    o_p = tl.arange(0, BLOCK_P)
    b_next = tl.load(base_ptr + c * BLOCK_E + o_e)
    end = tl.minimum(c * CHUNK + CHUNK, num_pairs)
    for p0 in range(c * CHUNK, end, BLOCK_P):
        b_e, _, mask_p = place_step(ids_ptr, slot_pair_ptr, p0, end, b_next, o_p, o_e, "")
        b_next += tl.histogram(b_e, BLOCK_E, mask=mask_p)


def dispatch_chunked(
    ids: torch.Tensor, n_experts: int, block_m: int, shared_rows: int, routed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """routing.dispatch's (slot_pair, block_expert) for any pair count, `routed` the routed
    pairs' worst-case blocks, in three launches and no host sync."""
    flat = ids.flatten()
    pairs, dev = flat.numel(), flat.device
    num_blocks = routed + triton.cdiv(shared_rows, block_m)
    slot_pair = torch.empty(num_blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    chunks = max(1, triton.cdiv(pairs, LAYOUT_CHUNK))
    be = triton.next_power_of_2(n_experts)
    counts = torch.empty((chunks, be), dtype=torch.int32, device=dev)
    base = torch.empty_like(counts)
    slots = routed * block_m
    stripe = triton.cdiv(slots, chunks)
    launch = pdl(dev)
    _count_kernel[(chunks,)](
        flat, counts, slot_pair, pairs, slots, stripe,
        BLOCK_E=be, CHUNK=LAYOUT_CHUNK, BLOCK_C=CLEAR, **launch,
    )  # fmt: skip
    _offsets_kernel[(1,)](
        counts, base, slot_pair, block_expert, pairs, chunks, routed, shared_rows,
        E=n_experts, BLOCK_M=block_m, BLOCK_E=be, BLOCK_C=CLEAR, BLOCK_B=LABELS, **launch,
    )  # fmt: skip
    _place_kernel[(chunks,)](
        flat, base, slot_pair, pairs, BLOCK_E=be, CHUNK=LAYOUT_CHUNK, BLOCK_P=STEP, **launch
    )
    return slot_pair, block_expert
