"""Triton causal attention (the siblings' gated full attention) vs its torch reference, the
masked kernel's bits with a causal mask, and its row invariance at prefill and decode widths.
On the CPU the interpreter runs small shapes in fp32 (tests/kernels/triton_env.py)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_triton_attention import (
    ATTN_SHAPE,
    _positions,
    attn_inputs,
    causal_mask,
    scale,
    tols,
)
from tests.kernels.triton_env import DEVICE, DTYPES, assert_dot_equal, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton as attn_tri
from flashlane.kernels.attention import triton_causal as causal_tri

pytestmark = needs_triton


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, l", [(1, 1), (1, 150), (3, 70), (64, 64), (65, 257)])
def test_causal_attention_matches_reference(t, l, dtype):
    b = 2
    q, k, v = attn_inputs(b, t, l, dtype, seed=l + t)
    pos = _positions(b, t, l)
    o = causal_tri.causal_attention(q, k, v, scale(), pos)
    o_ref = attn_ref.causal_attention(q.float(), k.float(), v.float(), scale(), pos)
    assert o.dtype == dtype and o.shape == q.shape and not o.isnan().any()
    torch.testing.assert_close(o.float(), o_ref, **tols(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_attention_is_the_masked_kernel_with_a_causal_mask(dtype):
    """The same bits as triton.attention with the causal mask, the walk bounded or not, with
    and without SKIP."""
    b, t, l = 2, 70, 250
    q, k, v = attn_inputs(b, t, l, dtype, seed=4)
    pos = _positions(b, t, l)
    masked = attn_tri.attention(q, k, v, causal_mask(b, t, l), scale(), positions=pos)
    cfg = attn_tri.CONFIGS[k.dtype]
    for skip in (True, False):
        got = causal_tri.causal_attention(q, k, v, scale(), pos, config=(*cfg[:5], skip))
        assert torch.equal(got, masked), skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_attention_row_invariance(dtype):
    """A row is bitwise the same in a prefill piece or a decode window of any width and
    offset, alone or in a batch, and beside a shorter stream padded with garbage keys past
    its length."""
    past, t, b = 180, 16, 3
    l = past + t
    q, k, v = attn_inputs(b, t, l, dtype, seed=11)
    pos = _positions(b, t, l)
    full = causal_tri.causal_attention(q, k, v, scale(), pos)
    for a, w in ((0, 1), (0, 5), (3, 1), (3, 9), (15, 1), (7, 9)):
        n = past + a + w
        part = causal_tri.causal_attention(
            q[:, a : a + w], k[:, :n], v[:, :n], scale(), pos[:, a : a + w]
        )
        # a row at another place in its tile: bitwise on the GPU (triton_env.DOT_TOL)
        assert_dot_equal(part, full[:, a : a + w], (a, w))
    for i in range(b):
        alone = causal_tri.causal_attention(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], scale(), pos[i : i + 1]
        )
        assert torch.equal(alone, full[i : i + 1])
    # stream 0 ends at 100 keys (its rows at 84..99); the others' keys go on to l
    short = 100
    rows0 = torch.arange(short - t, short, device=DEVICE)
    alone = causal_tri.causal_attention(q[:1], k[:1, :short], v[:1, :short], scale(), rows0[None])
    kk, vv = k.clone(), v.clone()
    kk[0, short:], vv[0, short:] = 1e4, -1e4
    mixed = torch.cat([rows0[None], pos[1:]])
    both = causal_tri.causal_attention(q, kk, vv, scale(), mixed)
    assert torch.equal(both[:1], alone) and torch.equal(both[1:], full[1:])
    lengths = torch.tensor([short, l, l], device=DEVICE)
    nan = kk.clone()
    nan[0, short:] = float("nan")  # past a length nothing is read, NaN included
    bounded = causal_tri.causal_attention(q, nan, vv, scale(), mixed, lengths=lengths)
    assert torch.equal(bounded, both)


@pytest.mark.parametrize("dtype", DTYPES)
def test_causal_sessions_rows_are_their_shared_windows_bits(dtype):
    """A lone step's rows (causal_sessions: sessions of different capacities read in place
    through their table, the length on the device) write each session's k, v row at its
    position and get bitwise what that session's one-row decode window gets in a shared
    round (causal_attention over the round's caches padded with zeros to the longest), and
    the reference's values."""
    from types import SimpleNamespace

    hq, hkv, d = ATTN_SHAPE
    lengths, caps = [5, 150, 77], [64, 256, 160]
    gen = torch.Generator().manual_seed(21)

    def cache(cap, n):
        k, v = (torch.randn(cap, hkv, d, generator=gen).to(DEVICE, dtype) for _ in range(2))
        k[n:], v[n:] = float("nan"), float("nan")  # past the length: never read
        empty = torch.empty(cap, 0, dtype=dtype, device=DEVICE)
        return SimpleNamespace(k=k, v=v, index_keys=empty, block_keys=empty, k_scale=None)

    caches = [cache(c, n) for c, n in zip(caps, lengths)]
    before = [(c.k.clone(), c.v.clone()) for c in caches]
    q, k, v = (torch.randn(3, h, d, generator=gen).to(DEVICE, dtype) for h in (hq, hkv, hkv))
    pos = torch.tensor(lengths, device=DEVICE)
    got = causal_tri.causal_sessions(q, k, v, caches, pos, scale())
    n = max(lengths) + 1
    keys, values = (torch.zeros(3, n, hkv, d, dtype=dtype, device=DEVICE) for _ in range(2))
    for i, (c, m) in enumerate(zip(caches, lengths)):
        assert torch.equal(c.k[m], k[i]) and torch.equal(c.v[m], v[i])
        assert torch.equal(c.k[:m], before[i][0][:m]) and c.k[m + 1 :].isnan().all()
        keys[i, : m + 1], values[i, : m + 1] = c.k[: m + 1], c.v[: m + 1]
    shared = causal_tri.causal_attention(q[:, None], keys, values, scale(), pos[:, None])
    assert_dot_equal(got, shared[:, 0], "shared")
    for i in range(3):
        alone = causal_tri.causal_attention(
            q[i : i + 1, None], keys[i : i + 1, : lengths[i] + 1],
            values[i : i + 1, : lengths[i] + 1], scale(), pos[i : i + 1, None],
        )  # fmt: skip
        assert_dot_equal(got[i : i + 1], alone[:, 0], i)
    refs = [cache(c, m) for c, m in zip(caps, lengths)]
    for r, c in zip(refs, caches):
        r.k[: c.k.shape[0]], r.v[: c.v.shape[0]] = c.k, c.v
    want = attn_ref.causal_sessions(q.float(), k.float(), v.float(), refs, pos, scale())
    torch.testing.assert_close(got.float(), want.float(), **tols(dtype))
