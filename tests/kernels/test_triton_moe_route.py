"""Triton MoE routing (`routing.pick_experts` through `route`, and `routing.dispatch`): bitwise
against the torch path they replaced.

* route: the previous code (its softmax kernel, copied below, then a stable descending sort,
  k-1 adds in rank order, a torch divide and a cast) is the oracle; ids and weights must be
  bitwise equal, ties included (the lower expert id first), and ids equal to `reference.route`.
* dispatch: the one-program kernel against `dispatch_by_sort` (the previous torch layout,
  still used above FUSED_DISPATCH_MAX_PAIRS pairs): the same two tensors.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_moe_route.py`.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DEVICE, DTYPES, exact_in_interpreter, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

import triton  # noqa: E402 (after the skip marker)
import triton.language as tl  # noqa: E402

from flashlane.kernels.linear.triton import linear  # noqa: E402
from flashlane.kernels.moe import reference as moe_ref  # noqa: E402
from flashlane.kernels.moe import routing  # noqa: E402
from flashlane.kernels.moe import triton as tmoe  # noqa: E402


@triton.jit
def _softmax_before(l_ptr, p_ptr, E: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < E
    logit = tl.load(l_ptr + pid * E + cols, mask=mask, other=-float("inf"))
    z = tl.exp(logit - tl.max(logit, axis=0))
    z = tl.where(mask, z, 0.0)
    tl.store(p_ptr + pid * E + cols, z / tl.sum(z, axis=0), mask=mask)


def _route_before(x, router, top_k, normalize):
    logits = linear(x.float(), router.float())
    e = logits.shape[1]
    probs = torch.empty_like(logits)
    # on the pick's warps: the sum's order follows them
    _softmax_before[(x.shape[0],)](
        logits, probs, E=e, BLOCK=triton.next_power_of_2(e), num_warps=routing.ROUTE_WARPS
    )
    top, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    top, ids = top[:, :top_k], ids[:, :top_k]
    if normalize:
        total = top[:, 0]
        for j in range(1, top_k):
            total = total + top[:, j]
        top = top / total[:, None]
    return top.to(x.dtype), ids


def _rand(*shape, seed, scale=1.0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(*shape, generator=g, device=DEVICE) * scale


def _bits(t):
    return t.view(torch.int32 if t.element_size() == 4 else torch.int16)


def _check_route(x, router, k, normalize):
    w, ids = tmoe.route(x, router, k, normalize)
    w_old, ids_old = _route_before(x, router, k, normalize)
    assert ids.dtype == torch.int64 and torch.equal(ids, ids_old)
    assert w.dtype == w_old.dtype and torch.equal(_bits(w), _bits(w_old)), (w - w_old).abs().max()
    return w, ids


# (E, k): a toy, an E that is no power of two, Flash Next
ROUTE_CASES = [(8, 3), (12, 5), (512, 10)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("case", ROUTE_CASES, ids=str)
@pytest.mark.parametrize("m", [1, 5, 33])
def test_route_matches_previous_path_bitwise(m, case, normalize, dtype):
    e, k = case
    h = 32
    router = _rand(e, h, seed=1, scale=h**-0.5).to(dtype)
    x = _rand(m, h, seed=2).to(dtype)
    _, ids = _check_route(x, router, k, normalize)
    assert torch.equal(ids, moe_ref.route(x, router, k, normalize)[1])


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("case", ROUTE_CASES, ids=str)
def test_route_ties_go_to_the_lower_expert(case, normalize):
    e, k = case
    h = 16
    router = exact_in_interpreter(_rand(e, h, seed=3, scale=h**-0.5))
    # exact ties: copies of one expert's row at higher ids, some inside the top k (through
    # any BLAS under the interpreter: exact_in_interpreter's values sum exactly)
    for lo, hi in ((0, e - 1), (1, e // 2), (2, 3), (2, e - 2)):
        router[hi] = router[lo]
    x = _rand(9, h, seed=4)
    x[0] = 0  # every logit 0: all experts tie, so ids 0..k-1
    x[1] = x[1] * 1e4  # one expert takes (almost) all; the rest tie at 0
    x[2] = router[2] * 10  # the tied experts 2, 3 lead
    x = exact_in_interpreter(x)
    w, ids = _check_route(x, router, k, normalize)
    assert ids[0].tolist() == list(range(k))
    assert torch.equal(ids, moe_ref.route(x, router, k, normalize)[1])
    if normalize:
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w[:, 0]))


def test_route_nan_row_takes_the_first_experts():
    """A NaN row comes out as torch's sort gives it (NaN first, lower id first): ids 0..k-1 in
    range for the expert kernels, NaN weights."""
    e, k, h = 16, 4, 8
    router = _rand(e, h, seed=5)
    x = _rand(3, h, seed=6)
    x[1, 3] = float("nan")
    for normalize in (False, True):
        w, ids = tmoe.route(x, router, k, normalize)
        w_old, ids_old = _route_before(x, router, k, normalize)
        assert torch.equal(ids, ids_old) and ids[1].tolist() == list(range(k))
        assert w[1].isnan().all()
        torch.testing.assert_close(w, w_old, rtol=0, atol=0, equal_nan=True)


def _pair_ids(kind, rows, k, e, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    if kind == "random":
        return torch.randint(0, e, (rows, k), generator=g, device=DEVICE)
    if kind == "one expert":
        return torch.full((rows, k), e - 1, dtype=torch.int64, device=DEVICE)
    # "duplicates": few experts, repeated within and across rows
    few = torch.tensor([0, e // 2, e - 1], device=DEVICE)
    return few[torch.randint(0, 3, (rows, k), generator=g, device=DEVICE)]


@pytest.mark.parametrize("kind", ["random", "one expert", "duplicates"])
@pytest.mark.parametrize("e", [8, 512])
@pytest.mark.parametrize("rows, k", [(1, 1), (1, 8), (2, 3), (7, 8), (64, 10)])
def test_dispatch_fused_matches_sort(rows, k, e, kind):
    ids = _pair_ids(kind, rows, k, e, seed=rows * 31 + k)
    for block_m, shared in ((tmoe.BLOCK_M, 0), (2, 0), (tmoe.BLOCK_M, rows), (2, rows)):
        got = routing.dispatch_fused(ids, e, block_m, shared)
        want = routing.dispatch_by_sort(ids, e, block_m, shared)
        assert torch.equal(got[0], want[0]), (rows, k, block_m, shared)
        assert torch.equal(got[1], want[1]), (rows, k, block_m, shared)
        if shared:  # every row once as a pair of expert e, after the routed pairs
            taken = got[0][(got[1] == e).repeat_interleave(block_m)]
            assert taken[taken >= 0].tolist() == list(range(rows * k, rows * k + rows))


def test_dispatch_fused_at_the_threshold():
    e = 512
    ids = _pair_ids("random", routing.FUSED_DISPATCH_MAX_PAIRS // 8, 8, e, seed=7)
    ids[::5] = ids[0]  # and some repeated rows
    got = routing.dispatch(ids, e, tmoe.BLOCK_M)
    want = routing.dispatch_by_sort(ids, e, tmoe.BLOCK_M)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("kind", ["random", "one expert", "duplicates"])
@pytest.mark.parametrize("rows, k, e", [(103, 10, 512), (410, 10, 60), (300, 8, 8)])
def test_dispatch_past_the_fused_pairs_matches_sort(rows, k, e, kind):
    """Past FUSED_DISPATCH_MAX_PAIRS (a prompt's MoE) the chunked launches (layout.py): the
    sort's tensors, with chunks of pairs that end mid-expert and mid-step, every block
    size, with and without the shared expert's rows."""
    from flashlane.kernels.moe.layout import LAYOUT_CHUNK

    assert rows * k > routing.FUSED_DISPATCH_MAX_PAIRS and rows * k % LAYOUT_CHUNK
    ids = _pair_ids(kind, rows, k, e, seed=rows + k)
    for block_m, shared in ((64, 0), (64, rows), (tmoe.BLOCK_M, rows), (2, 0)):
        got = routing.dispatch(ids, e, block_m, shared)
        want = routing.dispatch_by_sort(ids, e, block_m, shared)
        assert torch.equal(got[0], want[0]), (block_m, shared)
        assert torch.equal(got[1], want[1]), (block_m, shared)


def test_dispatch_in_chunks_past_the_most_chunks(monkeypatch):
    """Past MAX_CHUNKS chunks of LAYOUT_CHUNK pairs a chunk doubles (each place program sums
    every chunk's counts): chunks of 1,024 pairs, each counted in steps, and fewer chunks
    than blocks to label; the sort's tensors."""
    from flashlane.kernels.moe import layout

    monkeypatch.setattr(layout, "MAX_CHUNKS", 3)
    rows, k, e = 300, 8, 60
    assert layout.layout_chunk(rows * k) == 4 * layout.LAYOUT_CHUNK
    ids = _pair_ids("random", rows, k, e, seed=11)
    for block_m, shared in ((64, rows), (2, 0)):
        got = routing.dispatch(ids, e, block_m, shared)
        want = routing.dispatch_by_sort(ids, e, block_m, shared)
        assert torch.equal(got[0], want[0]), (block_m, shared)
        assert torch.equal(got[1], want[1]), (block_m, shared)


@pytest.mark.parametrize("rows, k, e", [(2, 3, 8), (7, 8, 512), (13, 10, 60)])
def test_pick_and_lay_out_is_the_pick_then_the_layout(rows, k, e):
    """One launch: the pick's weights and ids bitwise, and dispatch's layout of those ids
    (every block size, with and without the shared expert's rows); its counter is left at
    zero, so the next call (a replayed step) lays out right too."""
    g = torch.Generator(device=DEVICE).manual_seed(rows)
    logits = torch.randn(rows, e, generator=g, device=DEVICE) * 3
    logits[1, : e // 2] = logits[1, 0]  # ties: the lower ids first, pairs sharing experts
    want_w, want_ids = routing.pick_experts(logits, k, True, torch.float32)
    for block_m, shared in ((tmoe.BLOCK_M, 0), (2, 0), (tmoe.BLOCK_M, rows), (64, rows)):
        for _ in range(2):
            w, ids, slot_pair, block_expert = routing.pick_and_lay_out(
                logits, k, True, torch.float32, block_m, shared
            )
            assert torch.equal(_bits(w), _bits(want_w)) and torch.equal(ids, want_ids)
            want = routing.dispatch_by_sort(want_ids, e, block_m, shared)
            assert torch.equal(slot_pair, want[0]), (block_m, shared)
            assert torch.equal(block_expert, want[1]), (block_m, shared)


def test_pick_and_lay_out_past_the_fused_pairs():
    """Past FUSED_DISPATCH_MAX_PAIRS the layout is dispatch's own launches: the same."""
    e, k = 64, 16
    rows = routing.FUSED_DISPATCH_MAX_PAIRS // k + 1
    logits = torch.randn(rows, e, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    w, ids, *layout = routing.pick_and_lay_out(logits, k, False, torch.float32, tmoe.BLOCK_M)
    want_w, want_ids = routing.pick_experts(logits, k, False, torch.float32)
    want = routing.dispatch_by_sort(want_ids, e, tmoe.BLOCK_M)
    assert torch.equal(w, want_w) and torch.equal(ids, want_ids)
    assert all(map(torch.equal, layout, want))


def test_moe_same_through_either_dispatch(monkeypatch):
    h, e, i, k = 32, 8, 24, 3
    router = _rand(e, h, seed=8, scale=h**-0.5)
    gate, up = _rand(e, i, h, seed=9, scale=h**-0.5), _rand(e, i, h, seed=10, scale=h**-0.5)
    down = _rand(e, h, i, seed=11, scale=i**-0.5)
    x = _rand(20, h, seed=12)
    fused = tmoe.moe(x, router, gate, up, down, k, True)
    monkeypatch.setattr(routing, "FUSED_DISPATCH_MAX_PAIRS", 0)
    assert torch.equal(tmoe.moe(x, router, gate, up, down, k, True), fused)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pick_from_a_wider_aligned_row_is_the_pick_from_its_copy(dtype):
    """moe_shared routes on the first 512 columns of the router's 513 (its rows padded to
    528): the same weights and ids, bitwise, as from a contiguous copy."""
    g = torch.Generator(device=DEVICE).manual_seed(5)
    wide = torch.randn(9, 528, generator=g, device=DEVICE) * 3
    got = routing.pick_experts(wide[:, :512], 10, True, dtype)
    want = routing.pick_experts(wide[:, :512].contiguous(), 10, True, dtype)
    assert torch.equal(_bits(got[0]), _bits(want[0])) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("e", [512, 60])
def test_pick_bits_do_not_follow_the_row_stride(e):
    """A row's weights are the same bits whatever its view's row stride (contiguous, the
    padded 528 of moe_shared's router, an odd 513 as a single row's reshape left it) and
    whatever rows share the call. The kernel is specialised on the stride: on the H200 a
    stride of 513 loaded one value a thread, 528 four, and the softmax sum parted in its
    last bits (issue 28: a served reply alone and beside others). fp32 weights, so any
    difference shows."""
    rows = 2048 if DEVICE == "cuda" else 6
    g = torch.Generator(device=DEVICE).manual_seed(e)
    base = torch.randn(rows, e, generator=g, device=DEVICE)
    want = routing.pick_experts(base, 10, True, torch.float32)
    for width in (e, e + 1, -(-(e + 1) // 16) * 16):
        wide = torch.zeros(rows, width, device=DEVICE)
        wide[:, :e] = base
        view = wide[:, :e]
        got = routing.pick_experts(view, 10, True, torch.float32)
        assert torch.equal(_bits(got[0]), _bits(want[0])), width
        assert torch.equal(got[1], want[1]), width
        for i in (0, rows - 1):  # one row alone, its stride as torch's reshape leaves it
            one = view[i : i + 1].reshape(1, e)
            got = routing.pick_experts(one, 10, True, torch.float32)
            assert torch.equal(_bits(got[0][0]), _bits(want[0][i])), (width, i)
            assert torch.equal(got[1][0], want[1][i]), (width, i)
