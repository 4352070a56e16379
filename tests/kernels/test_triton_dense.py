"""Triton linear (the norms: test_triton_norms.py; the MoE: test_triton_moe.py): against the
pure-torch references, and row invariance (a row's output is bitwise the same whatever the
rows around it in the call: on the GPU; under the interpreter, whose dot is the host BLAS's,
within triton_env.DOT_TOL, see assert_dot_equal).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_dense.py`
(fp32, small shapes). GPU: `python -m pytest -m triton tests/kernels/test_triton_dense.py`
(fp32 and bf16, every M in 1..64, and the real Flash Next sizes).

Tolerances, as max |ours - ref| / max |ref| over a tensor:
* fp32 (interpreter and GPU): 1e-5; both sides compute in fp32 in different orders.
* bf16 linear: 8e-3 against an fp32 product of the same bf16 inputs (one bf16 rounding of
  the output, 2^-9 relative, plus fp32 accumulation noise).
* bf16 norms and MoE: against the bf16 reference, whose intermediate values are rounded to
  bf16 like ours, but possibly to the neighbouring bf16 value: 2e-2 for norms (one or two
  bf16 steps), 3e-2 for the MoE (such flips pass through gate/up, silu, down and k slots).
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import (
    DEVICE,
    DTYPES,
    HAS_CUDA,
    assert_dot_equal,
    dot_mismatch,
    exact_in_interpreter,
    needs_triton,
)

pytestmark = needs_triton
# without Triton installed the module skips before importing the kernels
pytest.importorskip("triton")

if HAS_CUDA:
    M_SWEEP = list(range(1, 65))
    OFFSETS = [0, 1, 7, 33]
else:
    M_SWEEP = [1, 2, 3, 5, 16, 17, 31, 64]
    OFFSETS = [0, 3]

TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}


def _rand(*shape, dtype=torch.float32, scale=1.0, seed=0):
    # made where the kernels run: the real-size MoE weights took ~15 s a test on the CPU
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dtype)


def _rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


def _check_rows(fn, full, m_sweep=M_SWEEP, offsets=OFFSETS):
    """fn(full[o:o+m]) == fn(full)[o:o+m] (assert_dot_equal: bitwise on the GPU), for every m
    and offset that fits."""
    ref = fn(full)
    bad = []
    for m in m_sweep:
        for o in offsets:
            if o + m > full.shape[0]:
                continue
            why = dot_mismatch(fn(full[o : o + m]), ref[o : o + m])
            if why:
                bad.append((m, o, why))
    assert not bad, f"rows differ from the full batch at (M, offset) {bad[:10]}"


def _check_other_rows(fn, full, seed=99, same_tiles=True):
    """Rows 0..m-1 stay bitwise the same when every other row of the batch changes. With
    same_tiles (a linear: each row keeps its place in the same tiles) that holds through any
    BLAS; otherwise (the MoE: the other rows' experts move rows between tiles) it is
    assert_dot_equal's claim."""
    keep = max(1, full.shape[0] // 3)
    other = full.clone()
    other[keep:] = _rand(*other[keep:].shape, dtype=full.dtype, seed=seed)
    if same_tiles:
        assert torch.equal(fn(full)[:keep], fn(other)[:keep])
    else:
        assert_dot_equal(fn(full)[:keep], fn(other)[:keep])


# ----------------------------------------------------------------------------------- linear

from flashlane.kernels.linear import triton as tlin  # noqa: E402 (after the skip marker)

if HAS_CUDA:
    LINEAR_NK = [(70, 130), (33, 300), (130, 1100), (2560, 2560), (640, 2560), (2560, 640)]
else:
    LINEAR_NK = [(70, 130), (33, 300), (130, 1100)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nk", LINEAR_NK)
@pytest.mark.parametrize("m", [1, 3, 17, 64, 65])
def test_linear_matches_reference(m, nk, dtype):
    n, k = nk
    x, w = _rand(m, k, dtype=dtype, seed=1), _rand(n, k, dtype=dtype, seed=2)
    y = tlin.linear(x, w)
    assert y.dtype == dtype and y.shape == (m, n)
    ref = x.double() @ w.double().T
    assert _rel_err(y, ref) < TOL[dtype]


def test_linear_leading_dims_and_router_size():
    n, k = (512, 2560) if HAS_CUDA else (24, 200)
    x, w = _rand(2, 3, k, seed=3), _rand(n, k, seed=4)
    y = tlin.linear(x, w)
    assert y.shape == (2, 3, n)
    assert _rel_err(y, x.double() @ w.double().T) < TOL[torch.float32]


# the split path's partials added by each tile's last program (fixup) or by a second kernel
SUMS = {"fixup": True, "sum-kernel": False}


@pytest.mark.parametrize("sums", SUMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "nk", LINEAR_NK[:3] + ([(2560, 2560), (512, 2560), (2560, 6144)] if HAS_CUDA else [])
)
def test_linear_row_invariant(nk, dtype, sums, monkeypatch):
    monkeypatch.setattr(tlin, "_FIXUP", SUMS[sums])
    n, k = nk
    full = _rand(200 if HAS_CUDA else 70, k, dtype=dtype, seed=5)
    w = _rand(n, k, dtype=dtype, seed=6)
    fn = lambda x: tlin.linear(x, w)  # noqa: E731
    _check_rows(fn, full)
    _check_other_rows(fn, full)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_split_and_in_program_partition_sums_agree(dtype, monkeypatch):
    """The split (decode) path, its partials added in the launch or by a second kernel, and
    the in-program (prefill) path do the same fp32 sums bitwise, so a row is the same whether
    its call is small or large."""
    n, k = (2560, 2560) if HAS_CUDA else (130, 1100)
    assert tlin.tile_config(n, k, dtype)["PARTS"] > 1
    x = _rand(600 if HAS_CUDA else 70, k, dtype=dtype, seed=7)
    w = _rand(n, k, dtype=dtype, seed=8)
    monkeypatch.setattr(tlin, "_IN_PROGRAM_TILES", 10**9)
    monkeypatch.setattr(tlin, "_FIXUP", False)
    two_kernels = tlin.linear(x, w)
    monkeypatch.setattr(tlin, "_FIXUP", True)
    split = tlin.linear(x, w)
    assert torch.equal(split, two_kernels)
    monkeypatch.setattr(tlin, "_IN_PROGRAM_TILES", 1)
    in_program = tlin.linear(x, w)
    assert torch.equal(split, in_program)
    monkeypatch.undo()
    if HAS_CUDA:  # the default threshold: 600 rows run in-program, 1..64 rows split
        big = tlin.linear(x, w)
        assert torch.equal(big, split)
        for m in (1, 5, 16, 64):
            assert torch.equal(tlin.linear(x[100 : 100 + m], w), big[100 : 100 + m])


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_fixup_is_one_launch_and_leaves_counters_zeroed(dtype, monkeypatch):
    """With the fixup the second kernel never runs, and every launch leaves the counters
    zeroed for the next (a wrong count would skip or repeat a tile's sum)."""
    from flashlane.kernels import partials

    n, k = (2560, 2560) if HAS_CUDA else (130, 1100)
    x = _rand(70, k, dtype=dtype, seed=9)
    w = _rand(n, k, dtype=dtype, seed=10)
    monkeypatch.setattr(tlin, "_FIXUP", False)
    calls = (70, 1, 70, 17)
    two_kernels = {m: tlin.linear(x[:m], w) for m in set(calls)}
    monkeypatch.setattr(tlin, "_FIXUP", True)
    monkeypatch.setattr(tlin, "_sum_parts_kernel", None)
    for m in calls:
        y = tlin.linear(x[:m], w)
        assert not partials._COUNTERS[x.device].any()
        assert torch.equal(y, two_kernels[m])  # the same tiles: bitwise through any BLAS
        assert_dot_equal(y, two_kernels[70][:m], m)  # rows of another call: row invariance


def test_linear_fixup_falls_back_while_capturing_without_counters(monkeypatch):
    """A graph capture that starts before the counters exist takes the second kernel (a
    capture cannot zero a new buffer), with the same bits."""
    from flashlane.kernels import partials

    n, k = 130, 1100
    x, w = _rand(5, k, seed=11), _rand(n, k, seed=12)
    fixup = tlin.linear(x, w)
    monkeypatch.setattr(partials, "_COUNTERS", {})
    monkeypatch.setattr(partials, "_capturing", lambda device: True)
    assert torch.equal(tlin.linear(x, w), fixup)
    assert not partials._COUNTERS


@pytest.mark.skipif(not HAS_CUDA, reason="CUDA graphs")
@pytest.mark.parametrize("made_before", [True, False])
def test_linear_split_in_cuda_graph(made_before, monkeypatch):
    """Replays of a captured split linear give the eager bits every time: the fixup's
    counters reset inside the graph, or (counters missing at capture) the second kernel."""
    from flashlane.kernels import partials

    n, k = 2560, 2560
    x, w = _rand(3, k, dtype=torch.bfloat16, seed=13), _rand(n, k, dtype=torch.bfloat16, seed=14)
    assert tlin.tile_config(n, k, x.dtype)["PARTS"] > 1
    eager = tlin.linear(x, w)
    # both variants compiled before the capture
    monkeypatch.setattr(tlin, "_FIXUP", False)
    assert torch.equal(tlin.linear(x, w), eager)
    monkeypatch.setattr(tlin, "_FIXUP", True)
    if not made_before:
        monkeypatch.setattr(partials, "_COUNTERS", {})
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = tlin.linear(x, w)
    assert (x.device in partials._COUNTERS) == made_before
    for _ in range(3):
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(y, eager)


NARROW = [torch.float16] + ([torch.bfloat16] if HAS_CUDA else [])


@pytest.mark.parametrize("sums", SUMS)
@pytest.mark.parametrize("dtype", [torch.float32, *NARROW])
@pytest.mark.parametrize("nk", [(33, 300), (130, 1100)] + ([(512, 2560)] if HAS_CUDA else []))
def test_linear_fp32_out(nk, dtype, sums, monkeypatch):
    """With the router's tensor cores off (_TENSOR_CORE_FP32_OUT = False), out_dtype=fp32
    reads x and w in their dtype and computes exactly what the fp32 path computes on their
    fp32 values: bitwise `linear(x.float(), w.float())` on the split and in-program paths,
    row-invariant. fp16 runs on the interpreter (its casts are exact); bf16 only on a GPU
    (the interpreter has no correct bf16)."""
    monkeypatch.setattr(tlin, "_FIXUP", SUMS[sums])
    monkeypatch.setattr(tlin, "_TENSOR_CORE_FP32_OUT", False)
    n, k = nk
    full = _rand(200 if HAS_CUDA else 70, k, dtype=dtype, seed=15)
    w = _rand(n, k, dtype=dtype, seed=16)
    fn = lambda x: tlin.linear(x, w, out_dtype=torch.float32)  # noqa: E731
    y = fn(full)
    assert y.dtype == torch.float32
    assert torch.equal(y, tlin.linear(full.float(), w.float()))
    _check_rows(fn, full)
    monkeypatch.setattr(tlin, "_IN_PROGRAM_TILES", 1)
    assert torch.equal(fn(full), y)


@pytest.mark.parametrize("dtype", [torch.float32, *NARROW])
@pytest.mark.parametrize(
    "nk", [(33, 700), (130, 1100)] + ([(324, 10240), (2560, 640)] if HAS_CUDA else [])
)
def test_linear_one_loop_over_partitions_gives_their_bits(nk, dtype, monkeypatch):
    """FLAT (one pipelined loop over every K block, each partition's sum joining the total at
    its last block: by a select at every block, FLAT 1; by a branch, 2)
    against the loop over partitions: the same bits, on exponent-spread inputs and on rows
    of zeros (no -0.0 may appear)."""
    n, k = nk
    x = _rand(130 if HAS_CUDA else 70, k, dtype=dtype, seed=31)
    x = x * torch.exp2(torch.randint(-12, 13, x.shape, device=DEVICE)).to(dtype)
    x[3] = 0.0
    w = -_rand(n, k, dtype=dtype, seed=32).abs()
    monkeypatch.setattr(tlin, "_IN_PROGRAM_TILES", 1)  # the in-program path at every M
    for out in {dtype, torch.float32}:
        cfg = (tlin.prefill_tile if x.shape[0] > tlin.DECODE_ROWS else tlin.tile_config)(
            n, k, dtype
        )
        assert cfg["PARTS"] > 1
        want = tlin.linear(x, w, out_dtype=out, tile=dict(cfg, FLAT=False))
        for flat in (1, 2):
            got = tlin.linear(x, w, out_dtype=out, tile=dict(cfg, FLAT=flat))
            assert torch.equal(got, want), flat
            assert not torch.signbit(got[3]).any()


@pytest.mark.parametrize("dtype", NARROW)
def test_linear_small_prefill_tiles_keep_the_bits(dtype):
    """A prefill call with too few rows for prefill_tile's 128 x 128 tiles to fill the SMs takes
    64 x 64 ones (row_tile), with the same partitions: a row's bits equal the same row in a
    decode call and in the 128 x 128 tiles (in one program and split)."""
    from flashlane.kernels.linear.tiles import FEW_PREFILL_TILES, row_tile

    n, k = (324, 10240) if HAS_CUDA else (33, 1536)
    m = 2048 if HAS_CUDA else 130
    big, small = tlin.prefill_tile(n, k, dtype), row_tile(m, n, k, dtype)
    assert big.get("FLAT") and -(-m // 128) * -(-n // 128) < FEW_PREFILL_TILES
    assert (small["BLOCK_M"], small["BLOCK_N"]) == (64, 64)
    assert small["PARTS"] == big["PARTS"]
    assert small["BLOCK_K"] * small["BLOCKS_PER_PART"] == big["BLOCK_K"] * big["BLOCKS_PER_PART"]
    assert row_tile(128 * FEW_PREFILL_TILES, n, k, dtype) == big  # enough rows: 128 x 128
    x, w = _rand(m, k, seed=51), _rand(n, k, seed=52)
    if HAS_CUDA:  # exponents spread over 2^-12..2^12; the interpreter: sums exact in any order
        x = x * torch.exp2(torch.randint(-12, 13, x.shape, device=DEVICE))
    x, w = exact_in_interpreter(x).to(dtype), exact_in_interpreter(w).to(dtype)
    y = tlin.linear(x, w)
    for split in (False, True):
        assert_dot_equal(y, tlin.linear(x, w, tile=dict(big, SPLIT=split)), split)
    for lo in (0, m - 5):
        assert_dot_equal(tlin.linear(x[lo : lo + 5], w), y[lo : lo + 5], lo)


@pytest.mark.parametrize("dtype", NARROW)
def test_linear_fp32_out_on_tensor_cores(dtype, monkeypatch):
    """The router's default (_TENSOR_CORE_FP32_OUT): bf16 / fp16 products on the tensor cores
    summed in fp32 and stored unrounded: row-invariant (decode and prefill tiles), within
    fp32 noise of the exact fp32 product, and not rounded to the inputs' dtype."""
    monkeypatch.setattr(tlin, "_TENSOR_CORE_FP32_OUT", True)
    n, k = (512, 2560) if HAS_CUDA else (33, 300)
    full = _rand(200 if HAS_CUDA else 70, k, dtype=dtype, seed=41)
    w = _rand(n, k, dtype=dtype, seed=42)
    fn = lambda x: tlin.linear(x, w, out_dtype=torch.float32)  # noqa: E731
    y = fn(full)
    assert y.dtype == torch.float32
    assert _rel_err(y, tlin.linear(full.float(), w.float())) < 1e-5
    assert not torch.equal(y, y.to(dtype).float())
    _check_rows(fn, full)


def test_linear_out_dtype_is_the_inputs_or_fp32():
    x, w = torch.zeros(2, 8), torch.zeros(3, 8)
    with pytest.raises(ValueError, match="out_dtype"):
        tlin.linear(x, w, out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="out_dtype"):
        tlin.linear(x.half(), w.half(), out_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="w is"):
        tlin.linear(x.half(), w, out_dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nk", [(70, 130), (324, 10240), (1281, 2560), (2560, 640), (16480, 2560)])
def test_linear_partitions_never_depend_on_m(nk, dtype):
    """The decode and prefill tiles differ in shape only: PARTS and the partitions' spans of
    K (the bits) are functions of (N, K, dtype) alone."""
    import inspect

    for tile in (tlin.tile_config, tlin.prefill_tile):
        assert list(inspect.signature(tile).parameters) == ["n", "k", "dtype"]
    d, p = tlin.tile_config(*nk, dtype), tlin.prefill_tile(*nk, dtype)
    assert d["PARTS"] == p["PARTS"]
    assert d["BLOCK_K"] * d["BLOCKS_PER_PART"] == p["BLOCK_K"] * p["BLOCKS_PER_PART"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_decode_and_prefill_tiles_agree(dtype):
    """A row in a call of DECODE_ROWS rows (the decode tile) and in one of more (the prefill
    tile), with normal values and with exponents spread over 2^-12..2^12: the same bits
    (on the GPU; the tiles' dots differ in shape, so assert_dot_equal)."""
    n, k = (1281, 2560) if HAS_CUDA else (130, 1100)
    g = torch.Generator(device=DEVICE).manual_seed(21)
    w = _rand(n, k, dtype=dtype, seed=22)
    spread = torch.exp2(torch.randint(-12, 13, (200, k), generator=g, device=DEVICE).float())
    for full in (_rand(200, k, dtype=dtype, seed=23), (_rand(200, k, seed=24) * spread).to(dtype)):
        big = tlin.linear(full, w)
        for o in (0, 70, 200 - tlin.DECODE_ROWS):
            rows = full[o : o + tlin.DECODE_ROWS]
            assert_dot_equal(tlin.linear(rows, w), big[o : o + tlin.DECODE_ROWS], o)


@pytest.mark.parametrize("m", [1, 2, 5])
def test_linear_keeps_the_padded_row_stride_for_every_row_count(m):
    """An aligned product's rows keep their padded stride for one row as for many (torch's
    reshape renormalised a size-1 dim: one row came back with stride N, and a kernel
    specialised on its input's stride compiled another variant for it; issue 28), through
    leading dims too."""
    g = torch.Generator(device=DEVICE).manual_seed(m)
    w = torch.randn(513, 64, generator=g, device=DEVICE)
    x = torch.randn(m, 64, generator=g, device=DEVICE)
    y = tlin.linear(x, w, aligned=True)
    assert y.shape == (m, 513) and y.stride() == (528, 1)
    y3 = tlin.linear(x[None], w, aligned=True)
    assert y3.shape == (1, m, 513) and y3.stride() == (528 * m, 528, 1)
    assert torch.equal(y3[0], y)
    assert tlin.linear(x[0], w, aligned=True).shape == (513,)
