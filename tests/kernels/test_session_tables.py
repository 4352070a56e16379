"""kernels.attend_sessions and kernels.gdn_sessions: a lone step's attention and GDN for
several sessions at once.

The Triton version reads and writes each session's caches in place through a table of their
offsets (models.state.attn_table) in six launches. Every row must get the bits it gets from
the per-session Triton kernels (its own session alone), and every cache must end bitwise
where the per-session writes leave it, whatever the other sessions' capacities, lengths and
contents: sessions of different capacities (one smaller than a block), rows short of and past
`top_blocks` complete blocks (so the ranking cuts), rows on a block's last position (the
pooled key is complete) and inside one. gdn_sessions updates each session's recurrent state
in place: states and outputs bitwise those of recurrent_gdn on each session alone.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DEVICE, DTYPES, HAS_CUDA, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton_sessions as attn_ses
from flashlane.kernels.gdn import reference as gdn_ref
from flashlane.kernels.gdn import triton as gdn_tri
from flashlane.models.state import AttnCache, attn_table, offsets_table

pytestmark = needs_triton

# (Hq, Hkv, D, Hi, Di, R)
SHAPE = (24, 2, 256, 4, 128, 64) if HAS_CUDA else (6, 2, 32, 2, 16, 8)
BLOCK, TOP = 4, 3


class _Cfg:
    num_kv_heads, head_dim = SHAPE[1], SHAPE[2]
    indexer_head_dim, indexer_block = SHAPE[4], BLOCK


def sessions(capacities, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for cap in capacities:
        c = AttnCache.empty(_Cfg, cap, dtype, DEVICE)
        for t in (c.k, c.v, c.index_keys, c.block_keys):
            t.copy_(torch.randn(t.shape, generator=gen).to(dtype))
        out.append(c)
    return out


def copies(caches):
    """Clones of the caches, every buffer (an 8-bit cache's scales too)."""
    return [AttnCache(*(t.clone() for t in c.tensors())) for c in caches]


def row_inputs(b, dtype, seed):
    hq, hkv, d, hi, di, r = SHAPE
    gen = torch.Generator().manual_seed(seed)
    shapes = [(b, hq, d), (b, hkv, d), (b, hkv, d), (b, hi, di), (b, di), (b, r), (b, r), (di,)]
    q, k, v, iq, raw, cos, sin, w = (
        torch.randn(s, generator=gen).to(dtype).to(DEVICE) for s in shapes
    )
    return q, k, v, iq, raw, cos, sin, w


def alone_and_together(base, rows, args):
    """The step's attention for copies of `base`: each session alone (the per-session
    kernels) and all together through one table -> (want, got, the alone copies, the
    together copies). rows: (q, k, v, iq, raw); args: attend_sessions' rest."""
    alone = copies(base)
    want = attn_ref.attend_sessions(*rows, alone, *args, ops=attn_ses._PER_SESSION)
    together = copies(base)
    got = attn_ses.attend_sessions(*rows, together, *args, table=attn_table(together))
    return want, got, alone, together


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("positions", [[9, 40, 2], [23, 63, 0], [3, 4, 1]])
def test_batched_sessions_match_each_session_alone(dtype, positions):
    capacities = [24, 64, 3]
    base = sessions(capacities, dtype, seed=sum(positions))
    q, k, v, iq, raw, cos, sin, w = row_inputs(len(capacities), dtype, seed=len(positions))
    pos = torch.tensor(positions, device=DEVICE)
    args = (pos, cos, sin, w, 1e-6, BLOCK, TOP, 0.125)

    want, got, alone, together = alone_and_together(base, (q, k, v, iq, raw), args)
    assert torch.equal(got, want)
    for a, b in zip(alone, together):
        for x, y in zip(
            (a.k, a.v, a.index_keys, a.block_keys), (b.k, b.v, b.index_keys, b.block_keys)
        ):
            assert torch.equal(x, y)
    # and the references agree with the kernels
    ref = attn_ref.attend_sessions(q, k, v, iq, raw, copies(base), *args)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)


def test_one_session_without_a_table_runs_the_per_session_kernels():
    dtype = torch.float32
    base = sessions([32], dtype, seed=5)
    q, k, v, iq, raw, cos, sin, w = row_inputs(1, dtype, seed=6)
    args = (torch.tensor([17], device=DEVICE), cos, sin, w, 1e-6, BLOCK, TOP, 0.125)
    want = attn_ref.attend_sessions(
        q, k, v, iq, raw, copies(base), *args, ops=attn_ses._PER_SESSION
    )
    assert torch.equal(attn_ses.attend_sessions(q, k, v, iq, raw, copies(base), *args), want)


@pytest.mark.parametrize("position", [0, 17, 31])
def test_one_session_with_a_table_matches_the_per_session_kernels(position):
    """A lone step of one session passes its attention table (runner/lone_step.py
    session_tables): the batched launches give the per-session kernels' bits, output and
    cache."""
    dtype = torch.float32
    base = sessions([32], dtype, seed=7)
    q, k, v, iq, raw, cos, sin, w = row_inputs(1, dtype, seed=8)
    args = (torch.tensor([position], device=DEVICE), cos, sin, w, 1e-6, BLOCK, TOP, 0.125)
    alone = copies(base)
    want = attn_ref.attend_sessions(q, k, v, iq, raw, alone, *args, ops=attn_ses._PER_SESSION)
    one = copies(base)
    got = attn_ses.attend_sessions(q, k, v, iq, raw, one, *args, table=attn_table(one))
    assert torch.equal(got, want)
    for x, y in zip(
        (alone[0].k, alone[0].v, alone[0].index_keys, alone[0].block_keys),
        (one[0].k, one[0].v, one[0].index_keys, one[0].block_keys),
    ):
        assert torch.equal(x, y)


def test_table_offsets_and_bad_buffers():
    caches = sessions([8, 16], torch.float32, seed=1)
    table = attn_table(caches).cpu()
    assert table.shape == (2, 8)
    assert table[0, :4].tolist() == [0, 0, 0, 0]
    assert table[:, 4].tolist() == [2, 4]  # block keys rows
    k0 = caches[0].k
    assert k0.data_ptr() + 4 * int(table[1, 0]) == caches[1].k.data_ptr()
    caches[1].v = caches[1].v.transpose(0, 1)
    with pytest.raises(ValueError, match="contiguous False"):
        attn_table(caches)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_sessions_update_each_state_in_place(dtype):
    h, dk, dv = (48, 128, 128) if HAS_CUDA else (4, 16, 48)
    b = 3
    gen = torch.Generator().manual_seed(7)
    q, k = (
        torch.nn.functional.normalize(torch.randn(b, 1, h, dk, generator=gen), dim=-1)
        .to(dtype)
        .to(DEVICE)
        for _ in range(2)
    )
    v = torch.randn(b, 1, h, dv, generator=gen).to(dtype).to(DEVICE)
    g = (-torch.rand(b, 1, h, generator=gen)).to(DEVICE)
    beta = torch.rand(b, 1, h, generator=gen).to(dtype).to(DEVICE)
    # separately allocated states, one of them between unrelated buffers
    states = [torch.randn(h, dk, dv, generator=gen).to(DEVICE) for _ in range(b)]
    alone = [s.clone() for s in states]
    want = []
    for i, s in enumerate(alone):
        o, _ = gdn_tri.recurrent_gdn(
            q[i : i + 1],
            k[i : i + 1],
            v[i : i + 1],
            g[i : i + 1],
            beta[i : i + 1],
            s[None],
            out=s[None, None],
        )
        want.append(o)
    ref_states = [s.clone() for s in states]
    ref = gdn_ref.gdn_sessions(q, k, v, g, beta, ref_states)
    got = gdn_tri.gdn_sessions(q, k, v, g, beta, states, offsets_table([states]))
    assert torch.equal(got, torch.cat(want))
    for s, a in zip(states, alone):
        assert torch.equal(s, a)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), ref.float(), rtol=tol, atol=tol)
    for s, r in zip(states, ref_states):
        torch.testing.assert_close(s, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gdn_sessions_keep_the_state_after_every_row(dtype):
    """A drafted step's window of T rows through the table: `after` gets the state after
    each row, bitwise recurrent_gdn's from the stacked states, and each session's state
    ends at its last row's; the reference keeps the same states."""
    h, dk, dv, b, t = 4, 16, 48, 2, 3
    gen = torch.Generator().manual_seed(8)
    q, k = (
        torch.nn.functional.normalize(torch.randn(b, t, h, dk, generator=gen), dim=-1)
        .to(dtype)
        .to(DEVICE)
        for _ in range(2)
    )
    v = torch.randn(b, t, h, dv, generator=gen).to(dtype).to(DEVICE)
    g = (-torch.rand(b, t, h, generator=gen)).to(DEVICE)
    beta = torch.rand(b, t, h, generator=gen).to(dtype).to(DEVICE)
    states = [torch.randn(h, dk, dv, generator=gen).to(DEVICE) for _ in range(b)]
    want_o, want = gdn_tri.recurrent_gdn(q, k, v, g, beta, torch.stack(states))
    ref_states = [s.clone() for s in states]
    ref_after = torch.full((b, t, h, dk, dv), float("nan"), device=DEVICE)
    ref_o = gdn_ref.gdn_sessions(q, k, v, g, beta, ref_states, after=ref_after)
    after = torch.full((b, t, h, dk, dv), float("nan"), device=DEVICE)
    got = gdn_tri.gdn_sessions(q, k, v, g, beta, states, offsets_table([states]), after=after)
    assert torch.equal(got, want_o) and torch.equal(after, want)
    for i, s in enumerate(states):
        assert torch.equal(s, want[i, -1])
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(ref_o.float(), got.float(), rtol=tol, atol=tol)
    torch.testing.assert_close(ref_after, after, rtol=1e-4, atol=1e-4)
    for s, r in zip(states, ref_states):
        torch.testing.assert_close(s, r, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="after must be"):
        gdn_tri.gdn_sessions(q, k, v, g, beta, states, after=after[:, :1])
