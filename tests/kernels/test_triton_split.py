"""The decode walk split over key ranges (kernels/attention/triton_walk.py, `split=True`):
each range walked by a program of its own from a fresh state, the partials folded in range
order. Against the reference within the usual tolerances; a row's bits its own (alone, in
another batch, another width, fewer ranges past its position); one range is the plain walk.
SPLIT_KEYS is patched small so that the test shapes cross several ranges."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_session_tables import BLOCK, TOP, alone_and_together, row_inputs, sessions
from tests.kernels.test_triton_attention import (
    _positions,
    attn_inputs,
    causal_mask,
    scale,
    sparse_mask,
    tols,
)
from tests.kernels.triton_env import DEVICE, DTYPES, assert_dot_equal, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton as attn_tri
from flashlane.kernels.attention import triton_walk

pytestmark = needs_triton


@pytest.fixture(autouse=True)
def the_walk(monkeypatch):  # split=True is the walk's here, whatever the default decode path
    monkeypatch.setattr(attn_tri, "GATHER", False)


@pytest.fixture
def ranges_of_64(monkeypatch):
    monkeypatch.setattr(triton_walk, "SPLIT_KEYS", 64)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["causal", "sparse"])
def test_split_walk_matches_the_reference(ranges_of_64, monkeypatch, kind, dtype):
    b, t, l = 2, 3, 300  # five ranges
    q, k, v = attn_inputs(b, t, l, dtype, seed=11)
    mask = causal_mask(b, t, l) if kind == "causal" else sparse_mask(b, t, l, seed=5)
    folds = []
    real = triton_walk.combine
    monkeypatch.setattr(
        triton_walk, "combine", lambda p, o, *a: folds.append(p[0].shape) or real(p, o, *a)
    )
    got = attn_tri.attention(q, k, v, mask, scale(), positions=_positions(b, t, l), split=True)
    assert folds == [(5, b * t * q.shape[2])]  # five ranges' partials, one row each
    want = attn_ref.attention(q.float(), k.float(), v.float(), mask, scale())
    torch.testing.assert_close(got.float(), want, **tols(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["causal", "sparse"])
def test_split_rows_are_their_own(ranges_of_64, kind, dtype):
    """A row alone (its keys only: fewer ranges), in narrower windows, or in a batch gives
    the bits it gives in the full call."""
    b, t, past = 3, 4, 250
    l = past + t
    q, k, v = attn_inputs(b, t, l, dtype, seed=7)
    mask = causal_mask(b, t, l) if kind == "causal" else sparse_mask(b, t, l, seed=2)
    pos = _positions(b, t, l)
    full = attn_tri.attention(q, k, v, mask, scale(), positions=pos, split=True)
    for i in range(b):
        for a, w in ((0, 1), (1, 2), (3, 1), (0, 4)):
            n = past + a + w
            one = attn_tri.attention(
                q[i : i + 1, a : a + w],
                k[i : i + 1, :n],
                v[i : i + 1, :n],
                mask[i : i + 1, a : a + w, :n],
                scale(),
                positions=pos[i : i + 1, a : a + w],
                split=True,
            )
            assert_dot_equal(one, full[i : i + 1, a : a + w], (i, a, w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_range_is_the_plain_walk(dtype):
    """Keys within one range (SPLIT_KEYS as shipped): the split call is the plain walk."""
    b, t, l = 2, 3, 200
    q, k, v = attn_inputs(b, t, l, dtype, seed=4)
    mask, pos = sparse_mask(b, t, l, seed=1), _positions(b, t, l)
    plain = attn_tri.attention(q, k, v, mask, scale(), positions=pos)
    assert torch.equal(attn_tri.attention(q, k, v, mask, scale(), positions=pos, split=True), plain)


def test_split_sessions_alone_and_together(monkeypatch):
    """A lone step's sessions through one table (ranges of 32 keys: up to two) against each
    session alone on the per-session kernels, bit for bit (test_session_tables' check)."""
    monkeypatch.setattr(triton_walk, "SPLIT_KEYS", 32)
    dtype = DTYPES[-1]
    base = sessions([24, 64, 3], dtype, seed=3)
    q, k, v, iq, raw, cos, sin, w = row_inputs(3, dtype, seed=1)
    pos = torch.tensor([20, 63, 1], device=q.device)
    args = (pos, cos, sin, w, 1e-6, BLOCK, TOP, 0.125)
    want, got, _, _ = alone_and_together(base, (q, k, v, iq, raw), args)
    assert torch.equal(got, want)


def test_combine_folds_only_the_ranges_below_a_rows_last_key():
    """Ranges past a row's last key (its length, its position) are not read: filled with
    garbage there, the result is the fold of the row's own ranges alone."""
    b, t, hq, d, ranges, keys = 2, 2, 3, 16, 5, 64
    gen = torch.Generator().manual_seed(3)
    rows = b * t * hq
    m = torch.randn(ranges, rows, generator=gen).to(DEVICE)
    l = torch.rand(ranges, rows, generator=gen).add(0.5).to(DEVICE)
    acc = torch.randn(ranges, rows, d, generator=gen).to(DEVICE)
    lengths = torch.tensor([300, 100], device=DEVICE)  # 5 and 2 ranges
    positions = torch.tensor([[130, 299], [50, 99]], device=DEVICE)  # 3, 5; 1, 2 ranges
    got = triton_walk.combine(
        (m, l, acc), torch.empty(b, t, hq, d, device=DEVICE), keys, 320, lengths, positions
    )
    for i in range(b):
        for j in range(t):
            mine = min(int(lengths[i]), int(positions[i, j]) + 1)
            own = -(-mine // keys)
            r = slice((i * t + j) * hq, (i * t + j + 1) * hq)
            w = torch.exp(m[:own, r] - m[:own, r].max(0).values)
            want = (acc[:own, r] * w[..., None]).sum(0) / (l[:own, r] * w).sum(0)[:, None]
            torch.testing.assert_close(got[i, j], want, rtol=1e-5, atol=1e-5)
