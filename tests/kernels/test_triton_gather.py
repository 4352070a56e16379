"""The gathered decode attention (kernels/attention/triton_gather.py): each key range's allowed
positions listed, only those keys read. Against the reference within the usual tolerances over
one range and several; a row's bits its own (alone, in another batch, window or cache length);
sessions through a table (16-bit and 8-bit caches) as each session alone; a row that allows
nothing gives NaN as the walks do; bad input named. RANGE_KEYS and CHUNK are patched small so
that the test shapes cross several ranges and listing steps."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_session_tables import BLOCK, TOP, copies, row_inputs, sessions
from tests.kernels.test_triton_attention import (
    _positions,
    attn_inputs,
    causal_mask,
    scale,
    sparse_mask,
    tols,
)
from tests.kernels.test_triton_kv8 import sessions8
from tests.kernels.triton_env import DTYPES, assert_dot_equal, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton_gather, triton_listed
from flashlane.kernels.attention import triton_sessions as attn_ses
from flashlane.kernels.attention.triton_gather import attention_gathered
from flashlane.kernels.attention.triton_listed import attention_listed
from flashlane.kernels.session_tables import attn_table

pytestmark = needs_triton


@pytest.fixture
def small_ranges(monkeypatch):
    monkeypatch.setattr(triton_gather, "RANGE_KEYS", 64)
    monkeypatch.setattr(triton_gather, "CHUNK", 16)
    # the listed attention: 64-key listings of two steps, slices of one step, at most three
    monkeypatch.setattr(triton_listed, "LIST_KEYS", 64)
    monkeypatch.setattr(triton_listed, "CHUNK", 32)
    monkeypatch.setattr(triton_listed, "SLICES", 3)
    monkeypatch.setattr(triton_listed, "STEPS", 1)


@pytest.fixture(params=["gathered", "listed"])
def gathered(request):
    """Each way of reading only the allowed keys: by ranges (triton_gather) or listed."""
    return attention_gathered if request.param == "gathered" else attention_listed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("l", [40, 300])  # one range; five
@pytest.mark.parametrize("kind", ["causal", "sparse"])
def test_gathered_attention_matches_the_reference(small_ranges, gathered, kind, l, dtype):
    b, t = 2, 3
    q, k, v = attn_inputs(b, t, l, dtype, seed=13)
    mask = causal_mask(b, t, l) if kind == "causal" else sparse_mask(b, t, l, seed=4)
    got = gathered(q, k, v, mask, scale(), positions=_positions(b, t, l))
    want = attn_ref.attention(q.float(), k.float(), v.float(), mask, scale())
    torch.testing.assert_close(got.float(), want, **tols(dtype))
    assert torch.equal(gathered(q, k, v, mask, scale()), got)  # positions: a bound


@pytest.mark.parametrize("dtype", DTYPES)
def test_gathered_rows_are_their_own(small_ranges, gathered, dtype):
    """A row alone (its keys only: fewer ranges), in narrower windows, or in a batch gives
    the bits it gives in the full call."""
    b, t, past = 3, 4, 250
    l = past + t
    q, k, v = attn_inputs(b, t, l, dtype, seed=3)
    mask, pos = sparse_mask(b, t, l, seed=8), _positions(b, t, l)
    full = gathered(q, k, v, mask, scale(), positions=pos)
    for i in range(b):
        for a, w in ((0, 1), (1, 2), (3, 1), (0, 4)):
            n = past + a + w
            one = gathered(
                q[i : i + 1, a : a + w], k[i : i + 1, :n], v[i : i + 1, :n],
                mask[i : i + 1, a : a + w, :n], scale(), positions=pos[i : i + 1, a : a + w],
            )  # fmt: skip
            assert_dot_equal(one, full[i : i + 1, a : a + w], (i, a, w))


def _through(monkeypatch, fn):
    """attend_sessions' attention (the table's and the per-session kernels') the gathered."""

    def through(q, k, v, mask, scale, lengths=None, table=None, positions=None, **kw):
        return fn(q, k, v, mask, scale, lengths, table, positions, kw.get("scales"))

    monkeypatch.setattr(attn_ses, "attention", through)
    monkeypatch.setattr(attn_ses._PER_SESSION, "attention", through)


def test_gathered_sessions_alone_and_together(small_ranges, gathered, monkeypatch):
    """A lone step's sessions through one table against each session alone on the
    per-session kernels, bit for bit; within tolerance of the reference."""
    _through(monkeypatch, gathered)
    dtype = DTYPES[-1]
    base = sessions([40, 200, 3], dtype, seed=3)
    q, k, v, iq, raw, cos, sin, w = row_inputs(3, dtype, seed=1)
    pos = torch.tensor([30, 190, 1], device=q.device)
    args = (pos, cos, sin, w, 1e-6, BLOCK, TOP, 0.125)
    rows = (q, k, v, iq, raw)
    want = attn_ref.attend_sessions(*rows, copies(base), *args, ops=attn_ses._PER_SESSION)
    got = attn_ses.attend_sessions(*rows, copies(base), *args)
    assert torch.equal(got, want)
    ref = attn_ref.attend_sessions(*rows, copies(base), *args)
    torch.testing.assert_close(got.float(), ref.float(), **tols(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gathered_8bit_sessions_each_alone_and_together(small_ranges, gathered, monkeypatch, dtype):
    """8-bit caches through one table: each session alone through the same launches gives the
    bits of its row together; near the reference on the dequantized caches."""
    _through(monkeypatch, gathered)
    base = sessions8([40, 200, 3], dtype, seed=5)
    q, k, v, iq, raw, cos, sin, w = row_inputs(3, dtype, seed=2)
    pos = torch.tensor([33, 150, 2], device=q.device)
    args = (pos, cos, sin, w, 1e-6, BLOCK, TOP, 0.125)
    rows = (q, k, v, iq, raw)
    got = attn_ses.attend_sessions(*rows, copies(base), *args, table=None)
    for i, c in enumerate(base):
        one = copies([c])
        pick = [x[i : i + 1] for x in (*rows, pos, cos, sin)]
        row = attn_ses.attend_sessions(
            *pick[:5], one, pick[5], pick[6], pick[7], *args[3:], table=attn_table(one)
        )
        assert torch.equal(row, got[i : i + 1])
    ref = attn_ref.attend_sessions(*rows, copies(base), *args)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


def test_a_row_that_allows_nothing_is_nan_and_bad_input_is_named(small_ranges, gathered):
    b, t, l = 1, 2, 100
    q, k, v = attn_inputs(b, t, l, torch.float32, seed=1)
    mask = causal_mask(b, t, l).clone()
    mask[0, 0] = False
    got = gathered(q, k, v, mask, scale())
    assert got[0, 0].isnan().all() and not got[0, 1].isnan().any()
    with pytest.raises(ValueError, match="q, k, v of"):
        gathered(q, k.double(), v, mask, scale())
    with pytest.raises(ValueError, match="mask"):
        gathered(q, k, v, mask[:, :1], scale())
    with pytest.raises(ValueError, match="needs lengths"):
        gathered(q, k, v, mask, scale(), table=torch.zeros(8, dtype=torch.long))


def test_split_calls_gather_when_switched_on(small_ranges, monkeypatch):
    """attention(..., split=True) with triton.GATHER on is the gathered attention."""
    from flashlane.kernels.attention import triton as attn_tri

    b, t, l = 2, 2, 150
    q, k, v = attn_inputs(b, t, l, torch.float32, seed=6)
    mask, pos = sparse_mask(b, t, l, seed=3), _positions(b, t, l)
    want = attention_gathered(q, k, v, mask, scale(), positions=pos)
    monkeypatch.setattr(attn_tri, "GATHER", True)
    assert torch.equal(attn_tri.attention(q, k, v, mask, scale(), positions=pos, split=True), want)
    monkeypatch.setattr(triton_listed, "LISTED", True)  # ... and with LISTED, the listed one
    want = attention_listed(q, k, v, mask, scale(), positions=pos)
    assert torch.equal(attn_tri.attention(q, k, v, mask, scale(), positions=pos, split=True), want)
