"""Triton causal attention (the siblings' gated full attention) vs its torch reference, the
masked kernel's bits with a causal mask, and its row invariance at prefill and decode widths.
On the CPU the interpreter runs small shapes in fp32 (tests/kernels/triton_env.py)."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_triton_attention import (
    _positions,
    attn_inputs,
    causal_mask,
    scale,
    tols,
)
from tests.kernels.triton_env import DEVICE, DTYPES, needs_triton

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
        assert torch.equal(part, full[:, a : a + w]), (a, w)
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
