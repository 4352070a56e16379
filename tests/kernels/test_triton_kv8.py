"""The 8-bit KV cache in the Triton kernels (--kv-cache-dtype fp8): the batched attend_sessions
writes e4m3 rows and their fp32 scales through the session table and reads them in its loads
(the pooling, the attention), giving each row the bits the per-session kernels give over the
session's dequantized cache (reference._put_row), and each cache the bytes the per-session
writes leave; the kernels that read e4m3 (attention with `scales`, pool_block_at with
`index_scale`) give the bits they give on the dequantized values.

Under the interpreter (TRITON_INTERPRET=1, fp32): the interpreter loads torch.float8_e4m3fn
buffers as Triton's float8e4nv and decodes every finite e4m3 code as torch does (checked
2026-12-02 over all 256 codes: only the two NaN codes, 0x7F and 0xFF, read as +-480; the
quantizer never stores them, and rows past a length are never read).

The 8-bit kernels against the dense ones over the dequantized cache: bit for bit where the
dequantized value is rounded to the cache's dtype before it is used (bf16, the GPU's dtype)
and under the interpreter; in fp32 on the GPU the product e4m3 x scale may be fused into the
next add (an FMA, Triton's default fp fusion), so there they agree within FUSED_TOL. Batched
against alone, both through the 8-bit kernels, is bit for bit in every dtype.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DEVICE, DTYPES, INTERPRET, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.attention import kv8
from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton as attn_tri
from flashlane.kernels.attention import triton_blocks as blocks_tri
from flashlane.kernels.attention import triton_sessions as attn_ses
from flashlane.models.state import AttnCache, attn_table
from tests.kernels.test_session_tables import (
    BLOCK,
    SHAPE,
    TOP,
    _Cfg,
    alone_and_together,
    copies,
    row_inputs,
)

pytestmark = needs_triton
FUSED_TOL = 1e-5  # fp32 on the GPU: e4m3 x scale fused into an add rounds once, not twice


def same_as_dequantized(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> bool:
    """The 8-bit kernels' result against the dense kernels' over the dequantized cache."""
    if INTERPRET or dtype != torch.float32:
        return torch.equal(got, want)
    return torch.allclose(got, want, rtol=FUSED_TOL, atol=FUSED_TOL)


def sessions8(capacities, dtype, seed):
    """8-bit caches of these capacities, every row filled (quantized random values)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for cap in capacities:
        c = AttnCache.empty(_Cfg, cap, dtype, DEVICE, fp8=True)
        for t, scale in ((c.k, c.k_scale), (c.v, c.v_scale), (c.index_keys, c.index_scale)):
            q, s = kv8.quantize(torch.randn(t.shape, generator=gen).to(DEVICE))
            t.copy_(q)
            scale.copy_(s)
        c.block_keys.copy_(torch.randn(c.block_keys.shape, generator=gen).to(dtype))
        out.append(c)
    return out


def same_bytes(a: AttnCache, b: AttnCache) -> bool:
    bits = [(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a.tensors(), b.tensors())]
    return all(torch.equal(x, y) for x, y in bits)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("positions", [[9, 40, 2], [23, 63, 0], [3, 4, 1]])
def test_batched_8bit_sessions_match_each_session_alone(dtype, positions):
    base = sessions8([24, 64, 3], dtype, seed=sum(positions))
    q, k, v, iq, raw, cos, sin, w = row_inputs(3, dtype, seed=len(positions))
    pos = torch.tensor(positions, device=DEVICE)
    args = (pos, cos, sin, w, 1e-6, BLOCK, TOP, 0.125)
    rows = (q, k, v, iq, raw)
    want, got, alone, together = alone_and_together(base, rows, args)
    assert same_as_dequantized(got, want, dtype)
    if INTERPRET or dtype != torch.float32:
        assert all(same_bytes(a, b) for a, b in zip(alone, together))
    # each session alone through the same 8-bit launches: the same bits in every dtype
    for i, c in enumerate(base):
        one = copies([c])
        pick = [x[i : i + 1] for x in (*rows, pos, cos, sin)]
        row = attn_ses.attend_sessions(
            *pick[:5], one, pick[5], pick[6], pick[7], *args[3:], table=attn_table(one)
        )
        assert torch.equal(row, got[i : i + 1])
        assert same_bytes(one[0], together[i])
    ref = attn_ref.attend_sessions(q, k, v, iq, raw, copies(base), *args)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


def test_the_table_names_the_scales():
    caches = sessions8([24, 64], torch.float32, seed=1)
    table = attn_table(caches).cpu()
    for col, name in ((5, "k_scale"), (6, "v_scale"), (7, "index_scale")):
        first, second = getattr(caches[0], name), getattr(caches[1], name)
        gap = (second.data_ptr() - first.data_ptr()) // 4
        assert table[:, col].tolist() == [0, gap]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("position", [3, 17, 30])
def test_pooling_8bit_keys_is_pooling_their_dequantized_values(dtype, position):
    (c,) = sessions8([32], dtype, seed=position)
    _, _, _, _, _, cos, sin, w = row_inputs(1, dtype, seed=2)
    pos = torch.tensor([position], device=DEVICE)
    want = c.block_keys.clone()
    dense = kv8.dequantize(c.index_keys, c.index_scale, dtype)
    blocks_tri.pool_block_at(dense, want, pos, cos, sin, w, 1e-6, BLOCK)
    got = c.block_keys.clone()
    blocks_tri.pool_block_at(c.index_keys, got, pos, cos, sin, w, 1e-6, BLOCK, None, c.index_scale)
    assert same_as_dequantized(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_over_8bit_caches_is_attention_over_their_values(dtype):
    hq, hkv, d = SHAPE[:3]
    gen = torch.Generator().manual_seed(4)
    b, t, n = 2, 5, 70
    q = torch.randn(b, t, hq, d, generator=gen).to(dtype).to(DEVICE)
    (k8, ks), (v8, vs) = (kv8.quantize(torch.randn(b, n, hkv, d, generator=gen)) for _ in "kv")
    k8, ks, v8, vs = (x.to(DEVICE) for x in (k8, ks, v8, vs))
    mask = (torch.rand(b, t, n, generator=gen) < 0.6).to(DEVICE)
    mask[..., 0] = True
    lengths = torch.tensor([n, 41], device=DEVICE)
    k, v = kv8.dequantize(k8, ks, dtype), kv8.dequantize(v8, vs, dtype)
    want = attn_tri.attention(q, k, v, mask, 0.125, lengths)
    got = attn_tri.attention(q, k8, v8, mask, 0.125, lengths, scales=(ks, vs))
    assert same_as_dequantized(got, want, dtype)
    with pytest.raises(ValueError, match="not e4m3"):
        attn_tri.attention(q, k, v, mask, 0.125, lengths, scales=(ks, vs))


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_8bit_session_without_a_table_reads_its_cache_in_place(dtype):
    """One session with no table: the batched launches (their own table), not the
    per-session kernels over a whole dequantized copy; the same bits (same_as_dequantized)."""
    base = sessions8([32], dtype, seed=9)
    q, k, v, iq, raw, cos, sin, w = row_inputs(1, dtype, seed=10)
    args = (torch.tensor([21], device=DEVICE), cos, sin, w, 1e-6, BLOCK, TOP, 0.125)
    alone = copies(base)
    want = attn_ref.attend_sessions(q, k, v, iq, raw, alone, *args, ops=attn_ses._PER_SESSION)
    one = copies(base)
    got = attn_ses.attend_sessions(q, k, v, iq, raw, one, *args)
    assert same_as_dequantized(got, want, dtype)
    if INTERPRET or dtype != torch.float32:
        assert same_bytes(alone[0], one[0])


def dequantized(c: AttnCache, n: int) -> list[torch.Tensor]:
    return [c.keys(n).float(), c.values(n).float(), c.index_rows(0, n).float()]


@pytest.mark.parametrize("b,depth", [(1, 3), (3, 2)])
def test_8bit_drafted_steps_through_size_tables(tiny_ckpt, monkeypatch, b, depth):
    """test_drafted_size_tables' drafted lone steps (the target's and the MTP head's 8-bit
    caches written and read through size tables, the pad session the anchor) against the
    same steps eagerly on the reference kernels: the same tokens and next drafts; each cache
    row within one e4m3 step of the reference's (the rows' inputs come through other
    kernels, so a value on a rounding boundary may round the other way), every other state
    within DOT_TOL."""
    from flashlane.kernels import REFERENCE
    from flashlane.kernels.gpu import TRITON
    from flashlane.models.loader import load_checkpoint
    from flashlane.models.state import SessionState
    from tests.kernels import test_drafted_size_tables as drafted_tables
    from tests.kernels.triton_env import DOT_TOL

    empty = SessionState.empty
    monkeypatch.setattr(SessionState, "empty", lambda *a, **k: empty(*a, **{**k, "kv_fp8": True}))
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float32)
    model.to(DEVICE)
    want, refs, want_drafts = drafted_tables.drafted(model, cfg, b, False, depth)
    try:
        got, sessions, drafts = drafted_tables.drafted(model, cfg, b, True, depth, TRITON)
    finally:
        model.use_kernels(REFERENCE)
    assert all(s.kv_fp8 for s in sessions)
    assert got == want and drafts == want_drafts
    for s, ref in zip(sessions, refs):
        assert s.length == ref.length and s.mtp_length == ref.mtp_length
        pairs = [(c, r, s.length) for c, r in zip(s.attn.values(), ref.attn.values())]
        pairs += [(c, r, s.mtp_length) for c, r in zip(s.mtp, ref.mtp)]
        for c, r, n in pairs:
            scales = (c.k_scale, c.v_scale, c.index_scale)
            for x, y, scale in zip(dequantized(c, n), dequantized(r, n), scales, strict=True):
                step = 32 * scale[:n].max().item()  # e4m3's step at the top binade
                assert (x - y).abs().max().item() <= step
        for g, h in zip(s.gdn.values(), ref.gdn.values()):
            for x, y in ((g.conv, h.conv), (g.recurrent, h.recurrent)):
                assert (x - y).abs().max().item() <= DOT_TOL * max(y.abs().max().item(), 1.0)


@pytest.mark.skipif(INTERPRET, reason="the interpreter's e4m3 cast is wrong: put_quantized's torch")
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_quantized_in_the_store_are_torchs_quantize(dtype):
    """triton_kv8.put_quantized (the decode rows' 8-bit writes in one launch) stores the bytes
    kv8.quantize and a copy store, at each session's row, over rows of every magnitude: a
    row of zeros (the scale's floor), subnormal scales, e4m3's subnormal codes, values on
    rounding ties."""
    from flashlane.kernels.attention import triton_kv8

    caches = sessions8([24, 64, 3, 9], dtype, seed=12)
    _, k, v, _, raw, *_ = row_inputs(4, dtype, seed=13)
    gen = torch.Generator().manual_seed(14)
    mags = 2.0 ** torch.randint(-140, 9, (3, 4, 2), generator=gen).float()
    k = k * mags[0].to(DEVICE)[:, :, None].to(dtype)
    v = v * mags[1].to(DEVICE)[:, :, None].to(dtype)
    raw = raw * mags[2, :, :1].to(DEVICE).to(dtype)
    k[1, 0] = 0.0
    v[2, 1] = torch.arange(v.shape[-1], device=DEVICE).to(dtype) * 0.5  # ties at 448 / max
    pos = torch.tensor([5, 63, 2, 8], device=DEVICE)
    want = copies(caches)
    for i, c in enumerate(want):
        at = pos[i : i + 1]
        for t, scale, x in (
            (c.k, c.k_scale, k),
            (c.v, c.v_scale, v),
            (c.index_keys, c.index_scale, raw),
        ):
            qx, sx = kv8.quantize(x[i : i + 1])
            t.view(torch.uint8).index_copy_(0, at, qx.view(torch.uint8))
            scale.index_copy_(0, at, sx)
    got = copies(caches)
    triton_kv8.put_quantized(got[0], attn_table(got), pos, k, v, raw)
    assert all(same_bytes(a, b) for a, b in zip(want, got))


def test_the_store_quantizes_as_kv8_before_its_cast():
    """triton_kv8.store's arithmetic on any backend, the interpreter too: with fp32 value
    buffers in place of e4m3 the clamped quotients land uncast. Each row's scale is max(amax
    * fp32(1/448), floor) (torch's amax / 448 on a GPU), its values x / scale (IEEE) clamped
    to +-448, at its own session's row through the table (k and v a scale a head, the raw
    key one); every other row untouched."""
    from flashlane.kernels.attention import triton_kv8

    hkv, d, di = SHAPE[1], SHAPE[2], SHAPE[4]
    gen = torch.Generator().manual_seed(15)

    def cache(cap):
        z = [torch.zeros(s, device=DEVICE) for s in ((cap, hkv, d), (cap, hkv, d), (cap, di))]
        fill = [torch.full(s, -1.0, device=DEVICE) for s in ((cap, hkv), (cap, hkv), (cap,))]
        return AttnCache(*z, torch.zeros(cap // BLOCK, di, device=DEVICE), *fill)

    caches = [cache(cap) for cap in (24, 64, 3)]
    before = copies(caches)
    k, v = (torch.randn(3, hkv, d, generator=gen) for _ in "kv")
    raw = torch.randn(3, di, generator=gen) * 2.0 ** torch.tensor([[-130], [0], [9]])
    k[1, 1] = 0.0  # a head's row of zeros: the floor, exact zeros
    pos = torch.tensor([5, 63, 2])
    dsts = [getattr(caches[0], c) for c in triton_kv8.COLUMNS]
    srcs = [x.to(DEVICE) for x in (k, v, raw[:, None])]
    triton_kv8.store(dsts, attn_table(caches), pos.to(DEVICE), srcs)
    for i, (c, old) in enumerate(zip(caches, before)):
        for x, t, scale in (
            (k, c.k, c.k_scale),
            (v, c.v, c.v_scale),
            (raw, c.index_keys, c.index_scale),
        ):
            g = x[i].reshape(scale[0].numel(), -1)
            amax = g.abs().amax(-1)
            want_s = torch.maximum(amax * torch.tensor(1 / 448.0), torch.tensor(kv8.SCALE_FLOOR))
            want_q = (g / want_s[:, None]).clamp(-448.0, 448.0)
            p = pos[i].item()
            assert torch.equal(scale[p].reshape(-1).cpu(), want_s)
            assert torch.equal(t[p].reshape(want_q.shape).cpu(), want_q)
        rest = [j for j in range(c.k.shape[0]) if j != pos[i].item()]
        rows = [getattr(x, name) for x in (c, old) for name in triton_kv8.COLUMNS]
        assert all(torch.equal(a[rest], b[rest]) for a, b in zip(rows[:6], rows[6:]))


@pytest.mark.parametrize("opts", [dict(BLOCK_L=16, STEPS=4), dict(num_stages=1)])
def test_the_8bit_folds_options_keep_each_row_its_own(opts, monkeypatch):
    """triton_listed.FOLD_OPTIONS8 (attention_decode.py --kv8's candidates): with each, a
    session's row alone is its row in the batch, and the result stays the attention over the
    dequantized cache (steps of 16 keys group the softmax otherwise: within fp32's rounding)."""
    from flashlane.kernels.attention import triton_listed

    hq, hkv, d = SHAPE[:3]
    gen = torch.Generator().manual_seed(16)
    b, n = 3, 150
    q = torch.randn(b, 1, hq, d, generator=gen).to(DEVICE)
    (k8, ks), (v8, vs) = (kv8.quantize(torch.randn(b, n, hkv, d, generator=gen)) for _ in "kv")
    k8, ks, v8, vs = (x.to(DEVICE) for x in (k8, ks, v8, vs))
    mask = (torch.rand(b, 1, n, generator=gen) < 0.5).to(DEVICE)
    mask[..., 0] = True
    pos = torch.full((b, 1), n - 1, device=DEVICE)

    def call(rows):
        return triton_listed.attention_listed(
            q[rows], k8[rows], v8[rows], mask[rows], 0.125, positions=pos[rows],
            scales=(ks[rows], vs[rows]),
        )  # fmt: skip

    want = call(slice(None))
    monkeypatch.setattr(triton_listed, "FOLD_OPTIONS8", opts)
    got = call(slice(None))
    assert all(torch.equal(call(slice(i, i + 1)), got[i : i + 1]) for i in range(b))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
