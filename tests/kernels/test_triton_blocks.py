"""The indexer's block keys in one launch (kernels/attention/triton_blocks.py): against
reference.block_keys, and `pool_block_at` (the lone step's, position on the device) giving
bit for bit the key `block_keys` gives that block (a lone step and a shared round agree).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_blocks.py`.
"""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.attention import reference as ref
from tests.kernels.triton_env import DEVICE, DTYPES, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.attention import triton_blocks as tr  # noqa: E402

TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2}


def _inputs(dtype, b=2, nb=5, block=4, di=24, r=8, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    raw = torch.randn(b, nb * block + 3, di, generator=g, device=DEVICE).to(dtype)  # a tail
    ang = torch.rand(nb, r, generator=g, device=DEVICE) * 6
    weight = (torch.randn(di, generator=g, device=DEVICE) * 0.1).to(dtype)
    return raw, ang.cos().to(dtype), ang.sin().to(dtype), weight


@pytest.mark.parametrize("dtype", DTYPES)
def test_block_keys_against_reference(dtype):
    raw, cos, sin, w = _inputs(dtype)
    got = tr.block_keys(raw, cos, sin, w, 1e-6, 4)
    want = ref.block_keys(raw, cos, sin, w, 1e-6, 4)
    assert got.shape == want.shape == (2, 5, 24)
    err = (got.double() - want.double()).abs().max() / want.double().abs().max()
    assert err.item() <= TOL[dtype]
    # one batch row alone gives its rows of the whole call (row invariance)
    assert torch.equal(tr.block_keys(raw[1:], cos, sin, w, 1e-6, 4), got[1:])


@pytest.mark.parametrize("dtype", DTYPES)
def test_pool_block_at_is_block_keys_for_that_block(dtype):
    raw, cos, sin, w = _inputs(dtype, b=1)
    keys = raw[0]
    whole = tr.block_keys(raw, cos, sin, w, 1e-6, 4)[0]
    out = torch.full((5, 24), 7.0, device=DEVICE).to(dtype)
    for pos in (0, 3, 9, 19):
        b = pos // 4
        tr.pool_block_at(keys, out, torch.tensor([pos], device=DEVICE), cos[b : b + 1],
                         sin[b : b + 1], w, 1e-6, 4)  # fmt: skip
        assert torch.equal(out[b], whole[b]), pos
    before = out.clone()  # a position past the last block writes nothing
    tr.pool_block_at(keys, out, torch.tensor([21], device=DEVICE), cos[:1], sin[:1], w, 1e-6, 4)
    assert torch.equal(out, before)
    want = before.clone()
    ref.pool_block_at(keys, want, torch.tensor([21], device=DEVICE), cos[:1], sin[:1], w,
                      1e-6, 4)  # fmt: skip
    assert torch.equal(want, before)


@pytest.mark.parametrize("dtype", DTYPES)
def test_put_rows_three_reads_column_slices_where_they_lie(dtype):
    """A window's keys, values and raw indexer keys are column slices of one fused
    projection (rows wider than theirs): put_rows_three stores each session's row at its
    position as index_copy_ of the rows would, with no copy made first."""
    from flashlane.kernels.session_tables import attn_table
    from flashlane.models.state import AttnCache

    g = torch.Generator(device=DEVICE).manual_seed(6)
    caches = [
        AttnCache(
            *(
                torch.zeros(s, device=DEVICE, dtype=dtype)
                for s in [(16, 2, 8)] * 2 + [(16, 8), (4, 8)]
            )
        )
        for _ in range(3)
    ]
    fused = torch.randn(3, 2 * 16 + 8 + 5, generator=g, device=DEVICE).to(dtype)
    k, v, raw = fused[:, :16], fused[:, 16:32], fused[:, 32:40]
    pos = torch.tensor([0, 5, 15], device=DEVICE)
    first = caches[0]
    tr.put_rows_three(
        [first.k, first.v, first.index_keys], ["k", "v", "index_keys"], attn_table(caches),
        pos, [k.view(3, 2, 8), v, raw]
    )  # fmt: skip
    for i, (c, p) in enumerate(zip(caches, pos.tolist())):
        assert torch.equal(c.k[p].flatten(), k[i]) and torch.equal(c.v[p].flatten(), v[i])
        assert torch.equal(c.index_keys[p], raw[i])
        rest = [j for j in range(16) if j != p]
        assert not c.k[rest].any() and not c.v[rest].any() and not c.index_keys[rest].any()
