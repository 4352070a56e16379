"""Prompt rows far into their context (kernels/attention/triton_far.py): rows at or past
FAR_ROWS read only their allowed keys. Against the reference within the usual tolerances; a
far row's bits its own (alone with only its keys, in other windows and offsets, another batch);
the rows before FAR_ROWS keep the walk's bits exactly; decode (split) calls never take it.
FAR_ROWS and CHUNK are patched small so that the test shapes cross the bound and several
listing chunks of two gathering steps."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_triton_attention import (
    _positions,
    attn_inputs,
    causal_mask,
    scale,
    sparse_mask,
    tols,
)
from tests.kernels.test_triton_kv8 import same_as_dequantized
from tests.kernels.triton_env import DTYPES, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.attention import kv8, triton_far
from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton as attn_tri

pytestmark = needs_triton

FAR = 240


@pytest.fixture
def far_rows(monkeypatch):
    monkeypatch.setattr(triton_far, "FAR_ROWS", FAR)
    monkeypatch.setattr(triton_far, "CHUNK", 64)


def _walk_only(monkeypatch):
    monkeypatch.setattr(triton_far, "FAR_ROWS", 1 << 20)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["causal", "sparse"])
def test_far_rows_match_the_reference(far_rows, kind, dtype):
    """A piece whose rows cross FAR_ROWS (walked, then far) near the reference."""
    b, t, l = 2, 12, 300  # positions 288..299 and, from a second call, 234..245
    q, k, v = attn_inputs(b, t, l, dtype, seed=5)
    mask = causal_mask(b, t, l) if kind == "causal" else sparse_mask(b, t, l, seed=6)
    got = attn_tri.attention(q, k, v, mask, scale(), positions=_positions(b, t, l))
    want = attn_ref.attention(q.float(), k.float(), v.float(), mask, scale())
    torch.testing.assert_close(got.float(), want, **tols(dtype))
    n = 246  # rows 234..245: six walked, six far, in one tile's tokens
    mask = causal_mask(b, t, n) if kind == "causal" else sparse_mask(b, t, n, seed=7)
    k, v = k[:, :n], v[:, :n]
    got = attn_tri.attention(q, k, v, mask, scale(), positions=_positions(b, t, n))
    want = attn_ref.attention(q.float(), k.float(), v.float(), mask, scale())
    torch.testing.assert_close(got.float(), want, **tols(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_far_rows_are_their_own(far_rows, dtype):
    """A far row alone (its keys only), in narrower windows at other offsets, or beside
    other batch entries gives the bits it gives in the full call."""
    b, t, past = 3, 8, 250
    l = past + t
    q, k, v = attn_inputs(b, t, l, dtype, seed=7)
    mask, pos = sparse_mask(b, t, l, seed=9), _positions(b, t, l)
    full = attn_tri.attention(q, k, v, mask, scale(), positions=pos)
    for i in range(b):
        for a, w in ((0, 1), (2, 3), (5, 1), (0, 8)):
            n = past + a + w
            one = attn_tri.attention(
                q[i : i + 1, a : a + w], k[i : i + 1, :n], v[i : i + 1, :n],
                mask[i : i + 1, a : a + w, :n], scale(), positions=pos[i : i + 1, a : a + w],
            )  # fmt: skip
            assert torch.equal(one, full[i : i + 1, a : a + w]), (i, a, w)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_before_far_keep_the_walks_bits(far_rows, monkeypatch, dtype):
    """Rows before FAR_ROWS: the walk's bits, whether the call has far rows or not; the far
    rows' are another grouping of the same keys (close, and not required equal)."""
    b, t, l = 2, 40, 280  # positions 240..279: every row far at FAR 240
    q, k, v = attn_inputs(b, t, l, dtype, seed=11)
    mask, pos = sparse_mask(b, t, l, seed=12), _positions(b, t, l)
    monkeypatch.setattr(triton_far, "FAR_ROWS", 260)
    with_far = attn_tri.attention(q, k, v, mask, scale(), positions=pos)
    _walk_only(monkeypatch)
    walked = attn_tri.attention(q, k, v, mask, scale(), positions=pos)
    assert torch.equal(with_far[:, :20], walked[:, :20])
    torch.testing.assert_close(with_far[:, 20:].float(), walked[:, 20:].float(), **tols(dtype))


def test_decode_calls_and_calls_without_positions_never_take_it(far_rows, monkeypatch):
    """Split (decode) calls gather their own way, and a call without positions walks."""
    calls = []
    monkeypatch.setattr(triton_far, "attend_far", lambda *a: calls.append(a))
    b, t, l = 1, 2, 300
    q, k, v = attn_inputs(b, t, l, DTYPES[-1], seed=1)
    mask, pos = causal_mask(b, t, l), _positions(b, t, l)
    attn_tri.attention(q, k, v, mask, scale(), positions=pos, split=True)
    attn_tri.attention(q, k, v, mask, scale())
    assert not calls
    attn_tri.attention(q, k, v, mask, scale(), positions=pos)
    assert len(calls) == 1
    short = attn_tri.attention(q[:, :1], k[:, :FAR], v[:, :FAR], mask[:, :1, :FAR], scale(),
                               positions=torch.full((1, 1), FAR - 1, device=q.device))  # fmt: skip
    assert len(calls) == 1 and short.isfinite().all()  # no row can be far with FAR keys


@pytest.mark.parametrize("dtype", DTYPES)
def test_far_rows_over_8bit_caches_are_over_their_values(far_rows, dtype):
    """Far rows over e4m3 caches and their scales (kv8.py) against the same rows over the
    dequantized caches, with lengths: the rows the dense kernels give (test_triton_kv8's)."""
    b, t, l = 2, 6, 300
    q, k, v = attn_inputs(b, t, l, dtype, seed=21)
    (k8, ks), (v8, vs) = (kv8.quantize(x.float().cpu()) for x in (k, v))
    k8, ks, v8, vs = (x.to(q.device) for x in (k8, ks, v8, vs))
    mask, pos = sparse_mask(b, t, l, seed=22), _positions(b, t, l)
    lengths = torch.tensor([l, l], device=q.device)
    k, v = kv8.dequantize(k8, ks, dtype), kv8.dequantize(v8, vs, dtype)
    want = attn_tri.attention(q, k, v, mask, scale(), lengths, positions=pos)
    got = attn_tri.attention(q, k8, v8, mask, scale(), lengths, positions=pos, scales=(ks, vs))
    assert same_as_dequantized(got, want, dtype)
