"""The fused row-wise tails (kernels/rowwise/triton.py) against their torch references, and
row invariance: a row's output is bitwise the same whatever the rows around it in the call
(through a dot, hc_down's and hc_up_mix's projections: on the GPU, and within DOT_TOL under
the interpreter, whose dot is the host BLAS's; triton_env's assert_dot_equal).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_rowwise.py`
(fp32); on a GPU also bf16, where the kernels' exp may differ from torch's in the last bit and
a rounding may then land on the neighbouring bf16 value (tolerance 2e-2 of the largest value).
"""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.rowwise import reference as ref
from tests.kernels.triton_env import DEVICE, DTYPES, assert_dot_equal, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.norms import triton as trn  # noqa: E402
from flashlane.kernels.rowwise import triton as tr  # noqa: E402
from flashlane.kernels.rowwise import triton_hc as trh  # noqa: E402
from flashlane.kernels.rowwise import triton_hc_up as trhu  # noqa: E402
from flashlane.kernels.rowwise import triton_rope as trope  # noqa: E402

TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2}


def _rand(*shape, dtype, seed, scale=2.0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dtype)


def _close(out, want, dtype):
    if out is None or want is None:
        assert out is None and want is None
        return
    assert out.dtype == want.dtype and out.shape == want.shape
    err = (out.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30)
    assert err.item() <= TOL[dtype], f"relative error {err.item():.3g}"


def _rows_invariant(fn, *full, dots=False):
    """fn on rows [o, o+m) of every input gives fn(full)'s rows bitwise (with `dots`, fn
    projects through a dot: assert_dot_equal)."""
    whole = fn(*full)
    whole = whole if isinstance(whole, tuple) else (whole,)
    for o, m in ((0, 1), (3, 1), (2, 5), (1, full[0].shape[0] - 1)):
        part = fn(*(x[o : o + m] for x in full))
        part = part if isinstance(part, tuple) else (part,)
        for got, want in zip(part, whole):
            if want is None:
                continue
            if dots:
                assert_dot_equal(got, want[o : o + m], (o, m))
            else:
                assert torch.equal(got, want[o : o + m]), (o, m)


@pytest.mark.parametrize("dtype", DTYPES)
def test_hc_squash_and_write(dtype):
    m, hc, h, low = 9, 4, 48, 20
    wide = _rand(m, low + hc + 3, dtype=dtype, seed=1)  # a column slice: strided rows
    d = wide[:, :low]
    _close(trh.hc_squash(d, hc), ref.hc_squash(d, hc), dtype)
    _rows_invariant(lambda x: trh.hc_squash(x, hc), d)
    r, y = _rand(m, hc * h, dtype=dtype, seed=2), _rand(m, h, dtype=dtype, seed=3)
    w = _rand(m, hc, dtype=dtype, seed=4, scale=1.0)
    _close(trh.hc_write(r, y, w), ref.hc_write(r, y, w), dtype)
    _rows_invariant(trh.hc_write, r, y, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_hc_write_norm(dtype):
    m, hc, h = 9, 4, 48
    r, y = _rand(m, hc * h, dtype=dtype, seed=27), _rand(m, h, dtype=dtype, seed=28)
    w = _rand(m, hc, dtype=dtype, seed=29, scale=1.0)
    weight = _rand(hc * h, dtype=dtype, seed=30, scale=0.1)
    got, want = trh.hc_write_norm(r, y, w, weight, 1e-6), ref.hc_write_norm(r, y, w, weight, 1e-6)
    assert torch.equal(got[0], trh.hc_write(r, y, w))  # the write's bits, the norm on them
    # the next read's norm, bit for bit: the lone step takes it across layers (runner/lone.py)
    assert torch.equal(got[1], trn.rms_norm(got[0], weight, 1e-6, h))
    _close(got[0], want[0], dtype)
    _close(got[1], want[1], dtype)
    _rows_invariant(lambda a, b, c: trh.hc_write_norm(a, b, c, weight, 1e-6), r, y, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_hc_write_norm_of_picked_rows(dtype):
    """rows [B]: the norm of one picked row of each run of N / B (a drafted step's last kept
    cell of each session's window), the bits of the whole call's norm of that row; the
    write's rows all as without."""
    m, hc, h = 9, 4, 48
    r, y = _rand(m, hc * h, dtype=dtype, seed=31), _rand(m, h, dtype=dtype, seed=32)
    w = _rand(m, hc, dtype=dtype, seed=33, scale=1.0)
    weight = _rand(hc * h, dtype=dtype, seed=34, scale=0.1)
    rows = torch.tensor([2, 3, 8], device=DEVICE)  # runs of three rows: first, first, last
    out, xn = trh.hc_write_norm(r, y, w, weight, 1e-6, rows)
    whole = trh.hc_write_norm(r, y, w, weight, 1e-6)
    assert torch.equal(out, whole[0]) and torch.equal(xn, whole[1][rows])
    want = ref.hc_write_norm(r, y, w, weight, 1e-6, rows)
    _close(out, want[0], dtype)
    _close(xn, want[1], dtype)
    with pytest.raises(ValueError, match="dividing"):
        trh.hc_write_norm(r, y, w, weight, 1e-6, rows[:2])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inject", [True, False])
def test_hc_mix(dtype, inject):
    m, hc, h = 9, 4, 1100  # h > one block: two column programs, the second ragged
    u, xn = _rand(m, hc * h, dtype=dtype, seed=5), _rand(m, hc * h, dtype=dtype, seed=6)
    inj = _rand(m, 20 + hc, dtype=dtype, seed=7)[:, 20:] if inject else None
    got, want = trh.hc_mix(u, xn, inj, hc), ref.hc_mix(u, xn, inj, hc)
    _close(got[0], want[0], dtype)
    _close(got[1], want[1], dtype)
    if inject:
        _rows_invariant(lambda a, b, c: trh.hc_mix(a, b, c, hc), u, xn, inj)
    else:
        _rows_invariant(lambda a, b: trh.hc_mix(a, b, None, hc), u, xn)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hc", [4, 3, 2])
@pytest.mark.parametrize("m", [9, 70])  # one launch; over 64 rows the two
def test_hc_up_mix_is_the_up_projection_then_the_mix(dtype, hc, m):
    """hc_up_mix is bit for bit linear(squashed, up) then hc_mix, with the write weights (on
    the GPU: the fused kernel's dots are laid out otherwise, so assert_dot_equal); the
    squashed columns a slice of a wider row, as hc_down leaves them; H ragged against the
    tile; rows alone give the same bits."""
    from flashlane.kernels.linear.triton import linear

    h, low = 44, 40
    both = _rand(m, low + hc + 4, dtype=dtype, seed=40, scale=1.0)
    s, inj = both[:, :low], both[:, low : low + hc]
    up = _rand(hc * h, low, dtype=dtype, seed=41, scale=0.3)
    xn = _rand(m, hc * h, dtype=dtype, seed=42)
    got = trhu.hc_up_mix(s, up, xn, inj, hc)
    want = trh.hc_mix(linear(s, up), xn, inj, hc)
    assert_dot_equal(got[0], want[0])
    assert_dot_equal(got[1], want[1])
    assert trhu.hc_up_mix(s, up, xn, None, hc)[1] is None
    _close(got[0], ref.hc_mix(ref.linear(s, up), xn, inj, hc)[0], dtype)
    _rows_invariant(lambda a, b, c: trhu.hc_up_mix(a, up, b, c, hc), s, xn, inj, dots=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_gates(dtype):
    m, hv = 9, 6
    proj = _rand(m, 2 * hv + 5, dtype=dtype, seed=8, scale=8.0)  # a and b: column slices
    a, b = proj[:, 5 : 5 + hv], proj[:, 5 + hv :]
    a_log, dt_bias = _rand(hv, dtype=torch.float32, seed=9), _rand(hv, dtype=dtype, seed=10)
    a[0, 0] = 40.0  # softplus's linear branch
    g, beta = tr.gdn_gates(a, b, a_log, dt_bias)
    g_ref, beta_ref = ref.gdn_gates(a, b, a_log, dt_bias)
    assert g.dtype == torch.float32
    _close(g, g_ref, torch.float32 if dtype == torch.float32 else dtype)
    _close(beta, beta_ref, dtype)
    _rows_invariant(lambda x, y: tr.gdn_gates(x, y, a_log, dt_bias), a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu(dtype):
    m, n = 9, 1500
    gu = _rand(m, 2 * n + 1, dtype=dtype, seed=11)  # [gate | up | shared gate], as stacked
    gate, up = gu[:, :n], gu[:, n : 2 * n]
    _close(tr.swiglu(gate, up), ref.swiglu(gate, up), dtype)
    _rows_invariant(tr.swiglu, gate, up)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_qk(dtype):
    heads, dim, rep = 2, 24, 3  # dim below its power-of-two block: masked lanes
    y = _rand(2, 5, 2 * heads * dim + 7, dtype=dtype, seed=14)  # q | k | v: [B, T, C]
    got, want = tr.gdn_qk(y, heads, dim, rep, dim**-0.5), ref.gdn_qk(y, heads, dim, rep, dim**-0.5)
    for g, w in zip(got, want):
        _close(g, w, dtype)
    flat = y.flatten(0, 1)
    _rows_invariant(lambda x: tr.gdn_qk(x, heads, dim, rep, dim**-0.5), flat)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_qk_copies_the_value_heads(dtype):
    """with_v: q and k bit for bit as without, and v the value heads' exact copy."""
    heads, dim, rep = 2, 24, 3
    y = _rand(7, 2 * heads * dim + heads * rep * dim + 5, dtype=dtype, seed=15)
    q, k, v = tr.gdn_qk(y, heads, dim, rep, dim**-0.5, with_v=True)
    q0, k0 = tr.gdn_qk(y, heads, dim, rep, dim**-0.5)
    assert torch.equal(q, q0) and torch.equal(k, k0) and v.is_contiguous()
    want = y[:, 2 * heads * dim : 2 * heads * dim + heads * rep * dim].unflatten(-1, (-1, dim))
    assert torch.equal(v, want)
    assert torch.equal(ref.gdn_qk(y, heads, dim, rep, dim**-0.5, with_v=True)[2], want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rope(dtype):
    n, heads, d, r = 7, 3, 20, 8  # partial rotary, D off the power-of-two block
    x = _rand(heads, n, d, dtype=dtype, seed=15).transpose(0, 1)  # strided, as block_keys
    cos, sin = _rand(n, r, dtype=dtype, seed=16), _rand(n, r, dtype=dtype, seed=17)
    _close(trope.rope(x, cos, sin), ref.rope(x, cos, sin), dtype)
    _rows_invariant(trope.rope, x.contiguous(), cos, sin)


def test_ngram_ids_bit_for_bit():
    n, heads, eos = 4, 3, 1
    g = torch.Generator(device=DEVICE).manual_seed(18)
    history = torch.randint(0, 6, (3, n - 1 + 9), generator=g, device=DEVICE)  # many eos
    history[0, :3] = eos  # a sequence start
    # multipliers large enough that the products wrap around int64, as in the checkpoint's
    mult = torch.tensor([2**61 + 3, 2**62 - 57, 2**60 + 11, 2**59 + 5], device=DEVICE)
    sizes = torch.tensor([7, 11, 13, 17, 19, 23, 29, 31, 37], device=DEVICE)
    offsets = torch.cumsum(sizes, 0) - sizes
    got = tr.ngram_ids(history, mult, sizes, offsets, n, heads, eos)
    want = ref.ngram_ids(history, mult, sizes, offsets, n, heads, eos)
    assert torch.equal(got, want)
    assert bool((want >= 0).all())  # negative hashes wrap to the table, as torch.remainder
    assert torch.equal(tr.ngram_ids(history[1:], mult, sizes, offsets, n, heads, eos), got[1:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [128, 1024])  # one partition; four, split over programs
@pytest.mark.parametrize("fixup", [True, False])  # partials added in the launch / a second
def test_hc_down_squashes_its_columns_as_it_stores_them(monkeypatch, dtype, k, fixup):
    """hc_down is bit for bit the linear with hc_squash on its first `low` columns and the
    rest (the inject columns) as the linear stored them, in each of the linear's paths."""
    from flashlane.kernels.linear import triton as lin

    monkeypatch.setattr(lin, "_FIXUP", fixup)
    m, hc, low = 9, 4, 40
    xn = _rand(m, k, dtype=dtype, seed=31)
    w = _rand(low + hc, k, dtype=dtype, seed=32, scale=0.2)
    got = trh.hc_down(xn, w, low, hc)
    assert got.stride(0) % 16 == 0  # rows padded: the up projection reads aligned rows
    plain = lin.linear(xn, w)
    assert torch.equal(got[:, :low], trh.hc_squash(plain[:, :low], hc))
    assert torch.equal(got[:, low:], plain[:, low:])
    _close(got, ref.hc_down(xn, w, low, hc), dtype)
    _rows_invariant(lambda x: trh.hc_down(x, w, low, hc), xn, dots=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block", [1, 4])
def test_cos_sin(dtype, block):
    """RoPE's tables in one launch: the reference's fp32 angles (positions up to 2^18, each
    first floored to its block), cos and sin cast; rows alone give the same bits."""
    from flashlane.models.layers.rotary import Rotary

    inv = Rotary(64, 1e7).inv_freq.to(DEVICE)
    pos = torch.tensor([0, 1, 5, 63, 64, 1000, 4097, 262143], device=DEVICE)
    got, want = trope.cos_sin(pos, inv, dtype, block), ref.cos_sin(pos, inv, dtype, block)
    for g, w in zip(got, want):
        assert g.shape == w.shape == (8, 64) and g.dtype == dtype
        assert (g.double() - w.double()).abs().max().item() <= (1e-6 if dtype == torch.float32
                                                                else 2**-7)  # fmt: skip
    if block > 1:  # the floor: 5 and 7 share their block's tables
        assert torch.equal(trope.cos_sin(pos[2:3] + 2, inv, dtype, block)[0], got[0][2:3])
    _rows_invariant(lambda p: trope.cos_sin(p, inv, dtype, block), pos)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_heads(dtype):
    n, heads, d = 7, 3, 20
    qg = _rand(n, heads, 2 * d, dtype=dtype, seed=33)  # q and its gate per head, as projected
    o, gate = _rand(n, heads, d, dtype=dtype, seed=34), qg[..., d:]
    _close(tr.gated_heads(o, gate), ref.gated_heads(o, gate), dtype)
    _rows_invariant(tr.gated_heads, o, gate)
