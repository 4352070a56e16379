"""The expert-sorted layout of a prompt's many (row, slot) pairs in two launches
(`routing.dispatch`'s contract, its tensors bit for bit): where ~48 torch launches with a
radix sort took ~0.4 ms a MoE layer of an 8k prefill on the H200, and their host time left
the GPU idle ~150 us before each layer's experts (timeline_prefill_8192_*_5f386bc_*.txt).

* count, grid (chunks,): each chunk of `layout_chunk(pairs)` pairs counts its pairs by
  expert, and clears its stripe of the slots to -1;
* place, grid (chunks,): each chunk sums every chunk's counts (each expert's padded segment,
  blocks of block_m) and the earlier chunks' (its first slot in each segment), then walks
  its pairs in order from those slots, a pair's rank among its chunk's earlier pairs of its
  expert added (`place_step`): stable, as the sort was. It also labels its stripe of the
  blocks with their experts (-1 past the used ones) and of the shared expert's blocks and
  slots. (The one-program layout of a decode round's few pairs sorts them instead:
  routing._layout.)

Chunks are short so that the walk, serial in a chunk, is short: at 2k rows (20,480 pairs)
chunks of 1,024 walked 64 steps and an offsets program summed the chunks serially, 136 us a
layer on the H200 (moe_layout_997cb52_*); at most MAX_CHUNKS chunks bound what each place
program sums.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.pdl import enter, pdl

# pairs a chunk of the count and place launches takes: at least this many, and more when a
# call has more than MAX_CHUNKS of them (each place program reads every chunk's counts)
LAYOUT_CHUNK = 256
MAX_CHUNKS = 320
# pairs a step of a chunk's walk ([STEP, experts] one-hot tiles)
STEP = 16
# slots a store clears or fills
CLEAR = 1024
# blocks a labelling step labels ([LABELS, experts] comparisons); chunks' counts a summing
# step reads ([SUM_CHUNKS, experts])
LABELS = 64
SUM_CHUNKS = 8


def layout_chunk(pairs: int) -> int:
    """Pairs a chunk of a layout of `pairs` pairs: LAYOUT_CHUNK, doubled while the chunks
    are more than MAX_CHUNKS."""
    chunk = LAYOUT_CHUNK
    while triton.cdiv(pairs, chunk) > MAX_CHUNKS:
        chunk *= 2
    return chunk


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


@triton.jit(do_not_specialize=["num_pairs", "num_slots", "stripe", "chunk"])
def _count_kernel(
    ids_ptr, counts_ptr, slot_pair_ptr, num_pairs, num_slots, stripe, chunk,
    BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    c = tl.program_id(0)
    o_p = tl.arange(0, BLOCK_P)
    hist = tl.zeros([BLOCK_E], dtype=tl.int32)
    end = tl.minimum(c * chunk + chunk, num_pairs)
    for p0 in range(c * chunk, end, BLOCK_P):
        m = p0 + o_p < end
        b_e = tl.load(ids_ptr + p0 + o_p, mask=m, other=0).to(tl.int32)
        hist += tl.histogram(b_e, BLOCK_E, mask=m)
    tl.store(counts_ptr + c * BLOCK_E + tl.arange(0, BLOCK_E), hist)
    o_c = tl.arange(0, BLOCK_C)
    lo = c * stripe
    hi = tl.minimum(lo + stripe, num_slots)
    for s0 in range(lo, hi, BLOCK_C):
        tl.store(slot_pair_ptr + s0 + o_c, -1, mask=s0 + o_c < hi)


@triton.jit(do_not_specialize=["num_pairs", "chunks", "chunk", "routed_blocks", "shared_rows"])
def _place_kernel(
    ids_ptr, counts_ptr, slot_pair_ptr, block_expert_ptr, num_pairs, chunks, chunk,
    routed_blocks, shared_rows, E: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_P: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    enter(PDL)
    c = tl.program_id(0)
    o_e = tl.arange(0, BLOCK_E)
    # every chunk's counts (the segments) and the earlier chunks' (this chunk's first slots)
    o_s = tl.arange(0, BLOCK_S)
    total = tl.zeros([BLOCK_E], dtype=tl.int32)
    before = tl.zeros([BLOCK_E], dtype=tl.int32)
    for c0 in range(0, chunks, BLOCK_S):
        cs = c0 + o_s
        part = tl.load(
            counts_ptr + cs[:, None] * BLOCK_E + o_e[None, :], mask=(cs < chunks)[:, None], other=0
        )
        total += tl.sum(part, axis=0)
        before += tl.sum(tl.where((cs < c)[:, None], part, 0), axis=0)
    blocks = (total + BLOCK_M - 1) // BLOCK_M
    end_b = tl.cumsum(blocks, axis=0)
    b_next = (end_b - blocks) * BLOCK_M + before
    o_p = tl.arange(0, BLOCK_P)
    end = tl.minimum(c * chunk + chunk, num_pairs)
    for p0 in range(c * chunk, end, BLOCK_P):
        b_e, _, mask_p = place_step(ids_ptr, slot_pair_ptr, p0, end, b_next, o_p, o_e, "")
        b_next += tl.histogram(b_e, BLOCK_E, mask=mask_p)
    # this chunk's stripe of the blocks: a block's expert is how many segments end at or
    # before it (the experts past E end with the last, so a block past every segment counts
    # them too: -1); the shared expert (id E) takes the blocks after the routed ones
    shared_blocks = (shared_rows + BLOCK_M - 1) // BLOCK_M
    all_blocks = routed_blocks + shared_blocks
    stripe = (all_blocks + chunks - 1) // chunks
    b_hi = tl.minimum(c * stripe + stripe, all_blocks)
    o_b = tl.arange(0, BLOCK_B)
    for b0 in range(c * stripe, b_hi, BLOCK_B):
        b = b0 + o_b
        ex = tl.sum((end_b[None, :] <= b[:, None]).to(tl.int32), axis=1)
        ex = tl.where(ex < E, ex, -1)
        ex = tl.where(b < routed_blocks, ex, E)
        tl.store(block_expert_ptr + b, ex, mask=b < b_hi)
    # and its stripe of the shared expert's slots: row r's pair num_pairs + r
    shared_slots = shared_blocks * BLOCK_M
    stripe_s = (shared_slots + chunks - 1) // chunks
    hi = tl.minimum(c * stripe_s + stripe_s, shared_slots)
    o_c = tl.arange(0, BLOCK_C)
    for s0 in range(c * stripe_s, hi, BLOCK_C):
        s = s0 + o_c
        pair = tl.where(s < shared_rows, num_pairs + s, -1)
        tl.store(slot_pair_ptr + routed_blocks * BLOCK_M + s, pair, mask=s < hi)


def dispatch_chunked(
    ids: torch.Tensor, n_experts: int, block_m: int, shared_rows: int, routed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """routing.dispatch's (slot_pair, block_expert) for any pair count, `routed` the routed
    pairs' worst-case blocks, in two launches and no host sync."""
    flat = ids.flatten()
    pairs, dev = flat.numel(), flat.device
    num_blocks = routed + triton.cdiv(shared_rows, block_m)
    slot_pair = torch.empty(num_blocks * block_m, dtype=torch.int32, device=dev)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=dev)
    chunk = layout_chunk(pairs)
    chunks = max(1, triton.cdiv(pairs, chunk))
    be = triton.next_power_of_2(n_experts)
    counts = torch.empty((chunks, be), dtype=torch.int32, device=dev)
    slots = routed * block_m
    stripe = triton.cdiv(slots, chunks)
    launch = pdl(dev)
    _count_kernel[(chunks,)](
        flat, counts, slot_pair, pairs, slots, stripe, chunk,
        BLOCK_E=be, BLOCK_P=LAYOUT_CHUNK, BLOCK_C=CLEAR, **launch,
    )  # fmt: skip
    _place_kernel[(chunks,)](
        flat, counts, slot_pair, block_expert, pairs, chunks, chunk, routed, shared_rows,
        E=n_experts, BLOCK_M=block_m, BLOCK_E=be, BLOCK_P=STEP, BLOCK_B=LABELS,
        BLOCK_S=SUM_CHUNKS, BLOCK_C=CLEAR, **launch,
    )  # fmt: skip
    return slot_pair, block_expert
