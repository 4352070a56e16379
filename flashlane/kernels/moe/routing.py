"""Triton MoE routing: which experts each row takes, and the expert-sorted slot layout.

* `pick_experts`: from `route`'s fp32 router logits, one program per row does the softmax,
  picks the top k (k rounds of "largest, ties to the lower expert id": a stable descending
  sort's first k), renormalises (p0 + p1 + ... in rank order, correctly rounded division)
  and casts. One launch, where a softmax kernel, `torch.sort` (a 21 us radix sort on an
  H200), k-1 adds, a divide and a cast took k + 3 or more.
* `dispatch`: pairs p = row*k + slot sorted by expert (stable) and padded to BLOCK_M per
  expert, in worst-case-sized buffers (no host sync). Up to FUSED_DISPATCH_MAX_PAIRS pairs
  (decode, verify rounds) one single-program kernel lays them out (a sort of the pairs in
  registers and two scans: `_layout`); beyond that (prefill)
  three launches over chunks of pairs (`layout.py`). Both give `dispatch_by_sort`'s tensors
  (the torch layout, kept as the tests' reference); the tests check it.
* `pick_and_lay_out`: both in the pick's launch: the last row's program to finish
  (kernels/partials.py's counter) lays the pairs out as `dispatch`'s kernel does, on the
  pick's one warp (a launch saved; the layout alone, then a walk of the pairs, measured 1.2
  us slower on one warp than on two at one row on the H200, route_warps_acbb0d2_h200.log).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashlane.kernels.moe.layout import dispatch_chunked
from flashlane.kernels.partials import counters, last_to_arrive
from flashlane.kernels.pdl import enter, pdl

# most pairs laid out by the one-program kernel: it sorts them all at once in registers
FUSED_DISPATCH_MAX_PAIRS = 1024
# slots set to -1 per store while clearing the layout
CLEAR_CHUNK = 1024
# warps of a row's pick and of the layout's one program: their reductions are serial steps,
# shuffles alone on one warp (route_warps_acbb0d2_h200.log, one row, before 656c213's sort: a
# decode layer's router, pick and layout 10.88 us on 4 and 4 warps, 10.13 on 1 and 2). The pick's
# softmax sum follows its warps (tests/kernels/test_triton_moe_route.py's oracle takes them)
ROUTE_WARPS, DISPATCH_WARPS = 1, 2


# stride_l specialised, always a multiple of 16 (pick_experts sees to it)
@triton.jit(do_not_specialize=["n", "num_blocks", "shared_rows", "routed_blocks"])
def _route_kernel(
    l_ptr,
    w_ptr,
    ids_ptr,
    stride_l,
    count_ptr,
    slot_pair_ptr,
    block_expert_ptr,
    n,
    num_blocks,
    shared_rows,
    routed_blocks,
    E: tl.constexpr,
    TOP_K: tl.constexpr,
    NORMALIZE: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    LAYOUT: tl.constexpr = 0,
    BLOCK_M: tl.constexpr = 16,
    BLOCK_S: tl.constexpr = 16,
    BLOCK_C: tl.constexpr = 1024,
    PDL: tl.constexpr = 0,
):
    # LAYOUT: the last of the n rows' programs to finish lays the pairs out (`_layout`)
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i_row = tl.program_id(0).to(tl.int64)
    o_e = tl.arange(0, BLOCK_E)
    mask_e = o_e < E
    # the softmax of the previous separate kernel, op for op: the same fp32 probabilities
    b_l = tl.load(l_ptr + i_row * stride_l + o_e, mask=mask_e, other=-float("inf"))
    b_z = tl.exp(b_l - tl.max(b_l, axis=0))
    b_z = tl.where(mask_e, b_z, 0.0)
    b_p = b_z / tl.sum(b_z, axis=0)
    # selection key: -1 for padding and taken experts; NaN ranks first as in torch's sort
    # (a NaN anywhere makes the whole row NaN), and 2 is above every probability
    b_key = tl.where(b_p == b_p, b_p, 2.0)
    b_key = tl.where(mask_e, b_key, -1.0)
    o_k = tl.arange(0, BLOCK_K)
    b_top = tl.zeros([BLOCK_K], dtype=tl.float32)
    b_ids = tl.zeros([BLOCK_K], dtype=tl.int64)
    # 0 + p0 is p0 exactly: the same sum as total = p0; total = total + p1; ...
    total = 0.0
    for j in tl.static_range(TOP_K):
        best = tl.max(b_key, axis=0)
        pick = tl.min(tl.where(b_key == best, o_e, BLOCK_E), axis=0)
        b_key = tl.where(o_e == pick, -1.0, b_key)
        p_j = tl.where(best > 1.0, float("nan"), best)
        total = total + p_j
        b_top = tl.where(o_k == j, p_j, b_top)
        b_ids = tl.where(o_k == j, pick, b_ids)
    if NORMALIZE:
        # IEEE division, as torch's fp32 divide (Triton's `/` may be approximate)
        b_top = tl.math.div_rn(b_top, tl.broadcast_to(total, [BLOCK_K]))
    mask_k = o_k < TOP_K
    tl.store(w_ptr + i_row * TOP_K + o_k, b_top.to(w_ptr.dtype.element_ty), mask=mask_k)
    tl.store(ids_ptr + i_row * TOP_K + o_k, b_ids, mask=mask_k)
    # a constexpr and a runtime test in one `and` would not fold the constexpr away
    if LAYOUT:  # noqa: SIM102
        if last_to_arrive(count_ptr, n):  # every row's ids stored: read them through L2
            _layout(
                ids_ptr, slot_pair_ptr, block_expert_ptr, n * TOP_K, num_blocks, shared_rows,
                routed_blocks, E, BLOCK_M, BLOCK_S, BLOCK_C, ".cg",
            )  # fmt: skip


def pick_experts(
    logits: torch.Tensor, top_k: int, normalize: bool, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax, top k and renormalisation of fp32 router logits [N, E] in one launch (the
    rows may be strided: the first E columns of a wider product).

    Returns (weights [N, k] in dtype, ids [N, k] int64), ids in rank order.
    """
    weights, ids, _ = _pick(logits, top_k, normalize, dtype)
    return weights, ids


def pick_and_lay_out(
    logits: torch.Tensor,
    top_k: int,
    normalize: bool,
    dtype: torch.dtype,
    block_m: int,
    shared_rows: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """pick_experts, then dispatch(ids, E, block_m, shared_rows), in the pick's launch where
    the pairs are at most FUSED_DISPATCH_MAX_PAIRS (else, or while a CUDA graph is captured
    before the counters exist, in two launches): the same tensors.

    Returns (weights [N, k], ids [N, k], slot_pair, block_expert) as those two give them.
    """
    n, e = logits.shape
    pairs = n * top_k
    count = counters(logits.device, 1) if 0 < pairs <= FUSED_DISPATCH_MAX_PAIRS else None
    if count is None:
        weights, ids = pick_experts(logits, top_k, normalize, dtype)
        return weights, ids, *dispatch(ids, e, block_m, shared_rows)
    routed = _routed_blocks(pairs, e, block_m)
    num_blocks = routed + triton.cdiv(shared_rows, block_m)
    slot_pair = torch.empty(num_blocks * block_m, dtype=torch.int32, device=logits.device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=logits.device)
    layout = dict(
        count=count, slot_pair=slot_pair, block_expert=block_expert, num_blocks=num_blocks,
        shared_rows=shared_rows, routed_blocks=routed, block_m=block_m,
    )  # fmt: skip
    weights, ids, _ = _pick(logits, top_k, normalize, dtype, layout)
    return weights, ids, slot_pair, block_expert


def _pick(logits, top_k: int, normalize: bool, dtype, layout: dict | None = None):
    """The pick's launch (with `layout`: pick_and_lay_out's buffers, laid out in it too)."""
    n, e = logits.shape
    if logits.stride(-1) != 1 or logits.stride(0) % 16 or logits.data_ptr() % 16:
        # the kernel is specialised on its stride and pointer (16 divides them or not): its
        # loads, and with them the softmax sum's order, follow. One variant for every call,
        # or a row's weights depend on the rows beside it (a single row's view of a padded
        # product had stride 513, two rows 528: other bits)
        padded = torch.empty((n, -(-e // 16) * 16), dtype=logits.dtype, device=logits.device)
        logits = padded[:, :e].copy_(logits)
    assert top_k <= e, f"top_k {top_k} > {e} experts"
    weights = torch.empty((n, top_k), dtype=dtype, device=logits.device)
    ids = torch.empty((n, top_k), dtype=torch.int64, device=logits.device)
    if n:
        lay = layout or {}
        _route_kernel[(n,)](
            logits, weights, ids, logits.stride(0),
            lay.get("count", ids), lay.get("slot_pair", ids), lay.get("block_expert", ids), n,
            lay.get("num_blocks", 0), lay.get("shared_rows", 0), lay.get("routed_blocks", 0),
            E=e, TOP_K=top_k, NORMALIZE=normalize, BLOCK_E=triton.next_power_of_2(e),
            BLOCK_K=triton.next_power_of_2(top_k), LAYOUT=layout is not None,
            BLOCK_M=lay.get("block_m", 16), BLOCK_S=sort_block(n * top_k), BLOCK_C=CLEAR_CHUNK,
            num_warps=ROUTE_WARPS, **pdl(ids.device),
        )  # fmt: skip
    return weights, ids, layout


@triton.jit(do_not_specialize=["num_pairs", "num_blocks", "shared_rows", "routed_blocks"])
def _dispatch_kernel(
    ids_ptr,
    slot_pair_ptr,
    block_expert_ptr,
    num_pairs,
    num_blocks,
    shared_rows,
    routed_blocks,
    E: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    _layout(
        ids_ptr, slot_pair_ptr, block_expert_ptr, num_pairs, num_blocks, shared_rows,
        routed_blocks, E, BLOCK_M, BLOCK_S, BLOCK_C, "",
    )  # fmt: skip


@triton.jit
def _segment_rank(e1, c1, e2, c2):
    """The scan's step over experts in sorted order: a run of one expert counts on."""
    return e2, tl.where(e1 == e2, c1 + c2, c2)


@triton.jit
def _layout(
    ids_ptr,
    slot_pair_ptr,
    block_expert_ptr,
    num_pairs,
    num_blocks,
    shared_rows,
    routed_blocks,
    E: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_C: tl.constexpr,
    CACHE: tl.constexpr,
):
    """`dispatch`'s layout from one program: the ids loaded with cache modifier CACHE (".cg"
    where other programs of the launch stored them). Its pairs (at most BLOCK_S, a power of
    two) sorted by (expert, pair) in registers; a scan gives each its rank in its expert, and
    a block starts at every BLOCK_M-th of an expert: the sort's stable order, padded per
    expert, with no loop over the pairs (a walk of [16, E] one-hot tiles took 30 us a layer
    at 160 pairs on the H100, 85925d6)."""
    o_c = tl.arange(0, BLOCK_C)
    num_slots = num_blocks * BLOCK_M
    for c0 in range(0, num_slots, BLOCK_C):
        tl.store(slot_pair_ptr + c0 + o_c, -1, mask=c0 + o_c < num_slots)
    for c0 in range(0, num_blocks, BLOCK_C):
        tl.store(block_expert_ptr + c0 + o_c, -1, mask=c0 + o_c < num_blocks)
    o_s = tl.arange(0, BLOCK_S)
    # a padding pair reads expert E: it sorts after every real one
    b_e = tl.load(ids_ptr + o_s, mask=o_s < num_pairs, other=E, cache_modifier=CACHE)
    key = tl.sort(b_e.to(tl.int32) * BLOCK_S + o_s)
    b_e, pair = key // BLOCK_S, key % BLOCK_S
    real = b_e < E
    _, run = tl.associative_scan((b_e, tl.full([BLOCK_S], 1, tl.int32)), 0, _segment_rank)
    rank = run - 1  # the pair's place among its expert's pairs, in pair order
    starts = (rank % BLOCK_M == 0).to(tl.int32)
    block = tl.cumsum(starts, 0) - 1  # blocks before: each expert's padded to BLOCK_M
    # the -1 stores above land before any pair's store below
    tl.debug_barrier()
    tl.store(slot_pair_ptr + block * BLOCK_M + rank % BLOCK_M, pair, mask=real)
    tl.store(block_expert_ptr + block, b_e, mask=real & (starts > 0))
    # the shared expert (id E): row r's pair num_pairs + r, in blocks after the routed ones
    for c0 in range(0, shared_rows, BLOCK_C):
        s = c0 + o_c
        at = routed_blocks * BLOCK_M + s
        tl.store(slot_pair_ptr + at, num_pairs + s, mask=s < shared_rows)
        tl.store(block_expert_ptr + at // BLOCK_M, E, mask=s < shared_rows)


def sort_block(pairs: int) -> int:
    """The pairs `_layout` sorts at once: a power of two, at least 16."""
    return max(16, triton.next_power_of_2(pairs))


def _routed_blocks(pairs: int, n_experts: int, block_m: int) -> int:
    """The routed pairs' worst-case blocks: each expert's segment padded to block_m."""
    return triton.cdiv(pairs, block_m) + min(n_experts, pairs)


def dispatch_by_sort(ids: torch.Tensor, n_experts: int, block_m: int, shared_rows: int = 0):
    """The torch layout (`dispatch`'s contract) through a stable sort, for any pair count."""
    flat = ids.flatten()
    pairs = flat.numel()
    dev = flat.device
    max_blocks = _routed_blocks(pairs, n_experts, block_m)
    # bincount reads the largest id back to the host; a scatter of ones does not
    counts = torch.zeros(n_experts, dtype=torch.long, device=dev).scatter_add_(
        0, flat, torch.ones_like(flat)
    )
    blocks = (counts + block_m - 1) // block_m
    blk_end = torch.cumsum(blocks, 0)
    blk_start = blk_end - blocks
    block_expert = torch.searchsorted(
        blk_end, torch.arange(max_blocks, device=dev, dtype=blk_end.dtype), right=True
    )
    block_expert = torch.where(block_expert < n_experts, block_expert, -1).to(torch.int32)
    sorted_e, order = torch.sort(flat, stable=True)
    seg_start = torch.cumsum(counts, 0) - counts
    rank = torch.arange(pairs, device=dev) - seg_start[sorted_e]
    dest = blk_start[sorted_e] * block_m + rank
    slot_pair = torch.full((max_blocks * block_m,), -1, dtype=torch.int32, device=dev)
    slot_pair[dest] = order.to(torch.int32)
    if shared_rows:
        shared = torch.arange(
            pairs,
            pairs + triton.cdiv(shared_rows, block_m) * block_m,
            dtype=torch.int32,
            device=dev,
        )
        slot_pair = torch.cat([slot_pair, torch.where(shared < pairs + shared_rows, shared, -1)])
        block_expert = torch.cat(
            [
                block_expert,
                torch.full(
                    (triton.cdiv(shared_rows, block_m),), n_experts, dtype=torch.int32, device=dev
                ),
            ]
        )
    return slot_pair, block_expert


def dispatch_fused(ids: torch.Tensor, n_experts: int, block_m: int, shared_rows: int = 0):
    """The same layout from one single-program launch; for up to a few thousand pairs."""
    flat = ids.flatten()
    pairs = flat.numel()
    routed = _routed_blocks(pairs, n_experts, block_m)
    num_blocks = routed + triton.cdiv(shared_rows, block_m)
    slot_pair = torch.empty(num_blocks * block_m, dtype=torch.int32, device=flat.device)
    block_expert = torch.empty(num_blocks, dtype=torch.int32, device=flat.device)
    if pairs:
        _dispatch_kernel[(1,)](
            flat,
            slot_pair,
            block_expert,
            pairs,
            num_blocks,
            shared_rows,
            routed,
            E=n_experts,
            BLOCK_M=block_m,
            BLOCK_S=sort_block(pairs),
            BLOCK_C=CLEAR_CHUNK,
            num_warps=DISPATCH_WARPS,
            **pdl(flat.device),
        )
    return slot_pair, block_expert


def dispatch(ids: torch.Tensor, n_experts: int, block_m: int, shared_rows: int = 0):
    """(slot_pair [blocks*block_m] int32: the pair in each slot or -1, block_expert [blocks]
    int32: the expert of each block or -1). ids: [N, k]. Pairs p = row*k + slot sorted by
    expert (stable), each expert's segment padded to block_m; blocks is the worst case
    cdiv(pairs, block_m) + min(E, pairs), so no host sync. shared_rows = N: then a shared
    expert (id E) takes every row, row r as pair N*k + r, in cdiv(N, block_m) blocks after
    those."""
    if ids.numel() <= FUSED_DISPATCH_MAX_PAIRS:
        return dispatch_fused(ids, n_experts, block_m, shared_rows)
    routed = _routed_blocks(ids.numel(), n_experts, block_m)
    return dispatch_chunked(ids, n_experts, block_m, shared_rows, routed)
