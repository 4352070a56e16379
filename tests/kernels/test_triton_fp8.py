"""Triton block-FP8 linear (kernels/linear/triton_fp8.py): against the reference (dequantize,
then the product in float64), and row invariance (a row's output bitwise the same alone or
in a batch of 1..17 rows, at any offset, whatever the other rows: on the GPU; under the
interpreter, whose dot is the host BLAS's, within triton_env.DOT_TOL, see assert_dot_equal).

The weights are real e4m3 tensors with float32 block scales: the interpreter loads e4m3 and
converts it to fp32 exactly (checked: every one of the 256 codes in
test_interpreter_reads_e4m3), so the tests run the kernel's own loads, in fp32 (x fp32: exact
fp32 products). Tolerances, as max |ours - ref| / max |ref|: fp32 1e-5 (fp32 sums in another
order than float64's); bf16 (GPU) 8e-3 (one bf16 rounding of the output plus fp32 noise).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_fp8.py`.
"""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels import row_kind
from flashlane.kernels.linear.act_quant import ROWS as QUANT_ROWS
from flashlane.kernels.linear.act_quant import act_quant, act_quant_ref
from flashlane.kernels.linear.fp8 import Fp8Weight
from flashlane.models.fp8 import quantize_blocks
from tests.kernels.triton_env import DEVICE, DTYPES, HAS_CUDA, dot_mismatch, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.linear import fp8_tiles  # noqa: E402 (after the skip marker)
from flashlane.kernels.linear import triton_fp8 as tfp8  # noqa: E402
from flashlane.kernels.linear.tiles import DECODE_ROWS  # noqa: E402

TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3}
if HAS_CUDA:
    NK = [(70, 130), (33, 300), (130, 1100), (2560, 2560), (640, 6144), (16480, 2560)]
    M_SWEEP, OFFSETS = [*range(1, 18), 31, 64], [0, 1, 7, 33]
else:
    NK = [(70, 130), (33, 300), (130, 1100)]
    M_SWEEP, OFFSETS = [1, 2, 3, 5, 16, 17], [0, 3]


def _x(m, k, dtype, seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(m, k, generator=g, device=DEVICE).to(dtype)


def _w(n, k, seed, spread=False):
    """An FP8 weight; spread: block scales over 2^-8..2^8 (each block its own magnitude)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g)
    if spread:
        w = w * 2.0 ** torch.randint(-8, 9, (n, 1), generator=g).float()
    q, s = quantize_blocks(w)
    return Fp8Weight(q.to(DEVICE), s.to(DEVICE))


def _rel_err(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", DTYPES)
def test_interpreter_reads_e4m3(dtype):
    """Every e4m3 code through the kernel (a 1 x 254 identity product) comes back exact,
    subnormals included: fp32 x on the exact fp32 products, bf16 x (a GPU's; the
    interpreter has no bf16) on the conversion by bits (triton_fp8.bf16_of_e4m3)."""
    codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
    finite = codes.float().isfinite()
    q = codes[finite].reshape(-1, 1).to(DEVICE)  # [N, 1]: one column, K = 1
    w = Fp8Weight(q, torch.ones(2, 1, device=DEVICE))
    y = tfp8.linear(torch.ones(1, 1, device=DEVICE, dtype=dtype), w)
    assert torch.equal(y[0].float().cpu(), codes[finite].float())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nk", NK)
@pytest.mark.parametrize("m", [1, 3, 17, 64, 65])
def test_linear_fp8_matches_reference(m, nk, dtype):
    n, k = nk
    x, w = _x(m, k, dtype, 1), _w(n, k, 2, spread=True)
    y = tfp8.linear(x, w)
    assert y.dtype == dtype and y.shape == (m, n)
    ref = x.double() @ w.dequantize(torch.float64).T
    assert _rel_err(y, ref) < TOL[dtype]


def test_linear_fp8_leading_dims_empty_and_dispatch():
    x, w = _x(6, 300, torch.float32, 3), _w(40, 300, 4)
    y = tfp8.linear(x.reshape(2, 3, 300), w)
    assert y.shape == (2, 3, 40)
    assert _rel_err(y.reshape(6, 40), x.double() @ w.dequantize(torch.float64).T) < 1e-5
    assert tfp8.linear(x[:0], w).shape == (0, 40)
    plain = w.dequantize(torch.float32)  # a plain weight takes the bf16 kernel's path
    assert _rel_err(tfp8.linear(x, plain), x.double() @ plain.double().T) < 1e-5
    with pytest.raises(ValueError, match="K=300"):
        tfp8.linear(x, _w(40, 200, 4))
    with pytest.raises(ValueError, match="out_dtype"):
        tfp8.linear(x, w, out_dtype=torch.float64)


def _check_rows(fn, full):
    ref = fn(full)
    bad = []
    for m in M_SWEEP:
        for o in OFFSETS:
            if o + m <= full.shape[0]:
                why = dot_mismatch(fn(full[o : o + m]), ref[o : o + m])
                if why:
                    bad.append((m, o, why))
    assert not bad, f"rows differ from the full batch at (M, offset) {bad[:10]}"


@pytest.mark.parametrize("fixup", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nk", NK)
def test_linear_fp8_row_invariant(nk, dtype, fixup, monkeypatch):
    """A row alone or among 1..17 (and, with 70 rows, the prefill tile's call of all of them)
    gives the same bits; and rows stay the same when every other row changes."""
    monkeypatch.setattr(tfp8, "_FIXUP", fixup)
    n, k = nk
    full = _x(200 if HAS_CUDA else 70, k, dtype, 5)
    w = _w(n, k, 6, spread=True)
    fn = lambda x: tfp8.linear(x, w)  # noqa: E731
    _check_rows(fn, full)
    other = full.clone()
    other[17:] = _x(full.shape[0] - 17, k, dtype, 7)
    assert torch.equal(fn(full)[:17], fn(other)[:17])


@pytest.mark.parametrize("m", [1, 20])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nk", [(640, 6144), (16480, 2560)] if HAS_CUDA else [(70, 1100)])
def test_linear_fp8_split_and_in_program_sums_agree(nk, dtype, m):
    """The split path (a program a partition, partials added in order) and the in-program
    path (one program, every partition) give the same bits for the same tile (a wide
    weight's decode tile too: fp8_tiles.DECODE_TILE_WIDE)."""
    n, k = nk
    x, w = _x(m, k, dtype, 8), _w(n, k, 9, spread=True)
    tile = tfp8.fp8_tile(m, n, k)
    assert tile["PARTS"] > 1
    split = tfp8.linear(x, w, tile=dict(tile, SPLIT=True))
    whole = tfp8.linear(x, w, tile=dict(tile, SPLIT=False))
    assert torch.equal(split, whole)


@pytest.mark.parametrize("nk", [(2560, 6144), (16384, 2560), (12288, 2560), (10240, 2560)])
def test_fp8_partitions_depend_on_n_k_and_the_rows_kind_only(nk):
    """A decode row's partitions are the same at every row count (decode_parts), a prompt
    row's too (fp8_parts); the wide weights' decode rows (one K partition in tiles of 64
    columns) take the partitions of tiles of 128 columns and DECODE_TILE_WIDE up to
    DECODE_ROWS."""
    n, k = nk
    decode, wide = fp8_tiles.decode_parts(n, k)
    assert wide == (fp8_tiles.fp8_parts(n, k)[0] == 1)
    assert wide == (n >= 10240)  # the in-projections, q and the n-gram keys of Flash Next
    for m in (1, 16, 64, 65, 4096):
        t = tfp8.fp8_tile(m, n, k)
        assert (t["PARTS"], t["BLOCKS_PER_PART"], t["BLOCK_K"]) == (*decode, 128)
        p = tfp8.fp8_tile(m, n, k, prompt=True)
        assert (p["PARTS"], p["BLOCKS_PER_PART"]) == fp8_tiles.fp8_parts(n, k)
        if m <= DECODE_ROWS:
            shape = fp8_tiles.DECODE_TILE_WIDE if wide else fp8_tiles.DECODE_TILE
            assert all(t[key] == shape[key] for key in shape if key != "SPLIT")
            # a program a partition where the tune timed it (one row tile), else the rule's
            assert t.get("SPLIT", False) == (wide and m <= 16)
    if wide:  # two or three partitions of the wide weights' 20 blocks of K
        assert decode[0] in (2, 3) and decode[0] * decode[1] >= k // 128


def test_fp8_decode_rows_never_take_rows_of_64_and_prompt_rows_always_do():
    """Rows of 64 run on wgmma, whose per-block dot from zero gave other bits than mma.sync's
    in a few elements on the H200 (benchmarks/fp8_bits_probe.py): a decode row's tile, linear
    and MoE, keeps to rows of 16 or 32 at any count; a prompt row's is wgmma's at any count
    (kernels/row_kind.py)."""
    from flashlane.kernels.moe import triton_fp8 as moe_fp8

    for n in (2560, 16384):
        for m in (1, 16, 64, 65, 200, 4096):
            assert tfp8.fp8_tile(m, n, 2560)["BLOCK_M"] in (16, 32)
            assert tfp8.fp8_tile(m, n, 2560, prompt=True)["BLOCK_M"] in (64, 128)
    assert moe_fp8.PREFILL_BLOCK_M in (16, 32) and moe_fp8.PROMPT_BLOCK_M == 64


def _act_ref(x: torch.Tensor) -> torch.Tensor:
    """x's rows as block-FP8 activations give them (act_quant_ref's codes times scales), fp64."""
    q, s = act_quant_ref(x)
    return q.double() * s.double().repeat_interleave(128, dim=1)[:, : x.shape[1]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nk", NK)
def test_linear_fp8_prompt_rows_near_reference_and_row_invariant(nk, dtype):
    """Prompt rows in their own tile, their activations in block FP8 (act_quant): near the
    reference of those activations, and a row alone or among 1..17 (at any offset) gives the
    bits it gets in the whole call: a prompt row's bits do not depend on its piece's size or
    the other rows."""
    n, k = nk
    full, w = _x(70, k, dtype, 11), _w(n, k, 12, spread=True)
    with row_kind.uniform(True):
        got = tfp8.linear(full, w)
        want = _act_ref(full) @ w.dequantize(torch.float64).T
        assert _rel_err(got, want) < TOL[dtype]
        _check_rows(lambda x: tfp8.linear(x, w), full)


def test_act_quant_ref_groups_rows_in_blocks_of_128():
    """A row's groups of 128 (the last partial): scale amax / 448 (1 for zeros), the codes
    e4m3 of x / scale, so each group's largest value is 448 and every value within half an
    e4m3 step of its code times the scale (2^-4 relative; 2^-10 of the scale among e4m3's
    subnormals)."""
    g = torch.Generator().manual_seed(16)
    x = torch.randn(3, 300, generator=g) * torch.tensor([1e-3, 1.0, 1e3])[:, None]
    x[1, 128:256] = 0.0
    q, s = act_quant_ref(x)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and s.shape == (3, 3)
    assert s[1, 1] == 1.0 and not q[1, 128:256].float().any()
    amax = torch.stack([x[:, a : a + 128].abs().amax(1) for a in (0, 128, 256)], 1)
    nonzero = amax > 0
    assert torch.equal(s[nonzero], amax[nonzero] / 448.0)
    back = _act_ref(x).float()
    step = s.repeat_interleave(128, dim=1)[:, :300] * 2.0**-10
    assert ((back - x).abs() <= torch.maximum(x.abs() * 2.0**-4, step)).all()


@pytest.mark.parametrize("m", [1, 37, 300])
def test_act_quant_kernel_gives_torchs_codes_and_scales(m, exact_e4m3):
    """The kernel's tiles of act_quant.ROWS rows (a last partial one, a partial last group of
    columns, rows of a longer stride) against torch's codes and scales, bit for bit."""
    for dtype in DTYPES:
        x = (_x(m, 320, dtype, 15) * 3.0)[:, :300]
        q, s = act_quant(x)
        qr, sr = act_quant_ref(x)
        assert torch.equal(s, sr)
        assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8))


def _exact_groups(m, k, seed):
    """Rows whose every group of 128 holds e4m3 codes times a power of two, one of them
    +-448 times it: each scale is that power and each value over it is a code, exactly."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (m, k), generator=g, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0  # no NaN
    vals = codes.view(torch.float8_e4m3fn).float()
    groups = -(-k // 128)
    vals[:, ::128] = 448.0 * torch.where(torch.rand(m, groups, generator=g) < 0.5, -1.0, 1.0)
    power = 2.0 ** torch.randint(-6, 7, (m, groups), generator=g).float()
    return vals * power.repeat_interleave(128, dim=1)[:, :k], power


@pytest.mark.skipif(HAS_CUDA, reason="the GPU runs test_act_quant_kernel_gives_torchs_codes")
def test_act_quant_kernel_tiles_rows_and_groups_under_the_interpreter():
    """The kernel's row tiles and masks under the interpreter, on values whose quotients are
    e4m3 codes exactly (its fp32 -> e4m3 cast rounds others wrong): the scales and codes of
    every row, a last partial tile of rows and a partial last group, rows of a longer
    stride, are torch's."""
    m, k = 2 * QUANT_ROWS + 3, 300
    full, power = _exact_groups(m, k + 20, 4)
    x = full.to(torch.bfloat16)[:, :k]
    assert torch.equal(x.float(), full[:, :k])
    q, s = act_quant(x)
    qr, sr = act_quant_ref(x)
    assert torch.equal(s, sr) and torch.equal(s, power[:, :3])
    assert torch.equal(q.view(torch.uint8), qr.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_fp8_mixed_forward_runs_each_kind_in_its_tile(dtype, monkeypatch):
    """In a forward of decode rows then prompt rows, one call is a launch per kind, each in
    its kind's tile, with the bits each kind's rows get alone."""
    n, k = NK[-1]
    x, w = _x(40, k, dtype, 13), _w(n, k, 14)
    tiles, real = [], tfp8.fp8_tile

    def spy(m, n, k, prompt=False):
        tiles.append((m, prompt))
        return real(m, n, k, prompt)

    monkeypatch.setattr(tfp8, "fp8_tile", spy)
    with row_kind.rows(9, 40):
        mixed = tfp8.linear(x, w)
    assert tiles == [(9, False), (31, True)]
    with row_kind.uniform(False):
        assert torch.equal(mixed[:9], tfp8.linear(x[:9], w))
    with row_kind.uniform(True):
        assert torch.equal(mixed[9:], tfp8.linear(x[9:], w))
