"""Session tables from an anchor (runner/lone.py's step graphs): one graph of B rows is
captured with the anchor's buffers and names any B sessions through a table of offsets from
them, which may point below the anchor. The kernels must then give each row its own session's
bits and leave every other buffer (the anchor's included) untouched: attend_sessions,
gdn_sessions and the PLE state's gather_sessions / put_sessions."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_session_tables import BLOCK, TOP, copies, row_inputs, sessions
from tests.kernels.triton_env import DEVICE, DTYPES, HAS_CUDA, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton_sessions as attn_ses
from flashlane.kernels.gdn import triton as gdn_tri
from flashlane.kernels.rowwise import reference as rows_ref
from flashlane.kernels.rowwise import triton_tables
from flashlane.models.state import PleState, attn_table, offsets_table, ple_table

pytestmark = needs_triton


def buffers(caches):
    return [t for c in caches for t in (c.k, c.v, c.index_keys, c.block_keys)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_through_an_anchor_table(dtype):
    # the anchor is the largest session and not among the rows; one row's session was
    # allocated before it (a negative offset), one after
    before = sessions([24], dtype, seed=1)
    anchor = sessions([64], dtype, seed=2)
    after = sessions([64, 8], dtype, seed=3)
    rows = [after[0], before[0], after[1]]
    positions = [40, 9, 5]
    q, k, v, iq, raw, cos, sin, w = row_inputs(3, dtype, seed=4)
    args = (torch.tensor(positions, device=DEVICE), cos, sin, w, 1e-6, BLOCK, TOP, 0.125)
    alone = copies(rows)
    want = attn_ref.attend_sessions(q, k, v, iq, raw, alone, *args, ops=attn_ses._PER_SESSION)
    anchor_before = [t.clone() for t in buffers(anchor)]
    table = attn_table(rows, anchor[0])
    got = attn_ses.attend_sessions(q, k, v, iq, raw, anchor * 3, *args, table=table)
    assert torch.equal(got, want)
    for x, y in zip(buffers(alone), buffers(rows)):
        assert torch.equal(x, y)
    for x, y in zip(anchor_before, buffers(anchor)):
        assert torch.equal(x, y)


def test_gdn_states_through_an_anchor_table():
    h, dk, dv = (48, 128, 128) if HAS_CUDA else (4, 16, 48)
    gen = torch.Generator().manual_seed(7)
    q, k = (
        torch.nn.functional.normalize(torch.randn(2, 1, h, dk, generator=gen), dim=-1).to(DEVICE)
        for _ in range(2)
    )
    v = torch.randn(2, 1, h, dv, generator=gen).to(DEVICE)
    g = (-torch.rand(2, 1, h, generator=gen)).to(DEVICE)
    beta = torch.rand(2, 1, h, generator=gen).to(DEVICE)
    first = torch.randn(h, dk, dv, generator=gen).to(DEVICE)
    anchor = torch.randn(h, dk, dv, generator=gen).to(DEVICE)
    last = torch.randn(h, dk, dv, generator=gen).to(DEVICE)
    states, kept = [last, first], anchor.clone()
    want_states = [s.clone() for s in states]
    want = gdn_tri.gdn_sessions(q, k, v, g, beta, want_states)
    table = offsets_table([states], bases=[anchor])
    got = gdn_tri.gdn_sessions(q, k, v, g, beta, [anchor, anchor], table)
    assert torch.equal(got, want)
    for s, w in zip(states, want_states):
        assert torch.equal(s, w)
    assert torch.equal(anchor, kept)


def ple_states(n: int, seed: int) -> list[PleState]:
    gen = torch.Generator().manual_seed(seed)
    return [
        PleState(
            conv=torch.randn(6, 16, generator=gen).to(DEVICE),
            ids=torch.randint(0, 500, (3,), generator=gen).to(DEVICE),
        )
        for _ in range(n)
    ]


@pytest.mark.parametrize("column", ["conv", "ids"])
def test_gather_and_put_through_an_anchor_table(column):
    before, (anchor,), after = ple_states(2, 1), ple_states(1, 2), ple_states(2, 3)
    rows = [after[1], before[0], after[0], before[1]]
    col = 0 if column == "conv" else 1
    table = ple_table(rows, anchor)
    mine = [getattr(p, column) for p in rows]
    kept = getattr(anchor, column).clone()
    stacked = triton_tables.gather_sessions([getattr(anchor, column)] * 4, table, col)
    assert torch.equal(stacked, rows_ref.gather_sessions(mine))
    new = stacked.flip(0) + 1
    want = [m.clone() for m in mine]
    rows_ref.put_sessions(want, new)
    triton_tables.put_sessions([getattr(anchor, column)] * 4, new, table, col)
    for got, w in zip(mine, want):
        assert torch.equal(got, w)
    assert torch.equal(getattr(anchor, column), kept)
    # without a table: the buffers handed in, from the first
    assert torch.equal(triton_tables.gather_sessions(mine), torch.stack(mine))


@pytest.mark.parametrize("column", ["conv", "ids"])
def test_gather_with_a_tail_appends_each_sessions_rows_in_one_launch(column):
    """tail [B, m, ...]: gather_sessions' [B, n + m, ...] is the gathered buffers then the
    tail's rows (a drafted step's PLE ids, then its window), as the reference's; session b's
    row reads its own buffer and tail row alone."""
    before, (anchor,), after = ple_states(2, 4), ple_states(1, 5), ple_states(2, 6)
    rows = [after[1], before[0], after[0], before[1]]
    col = 0 if column == "conv" else 1
    table = ple_table(rows, anchor)
    mine = [getattr(p, column) for p in rows]
    tail = torch.stack(mine)[:, :2] * 3 + 1
    got = triton_tables.gather_sessions([getattr(anchor, column)] * 4, table, col, tail=tail)
    want = torch.cat([torch.stack(mine), tail], dim=1)
    assert torch.equal(got, want)
    assert torch.equal(rows_ref.gather_sessions(mine, tail=tail), want)
    with pytest.raises(ValueError, match="tail"):
        triton_tables.gather_sessions([getattr(anchor, column)] * 4, table, col, tail=tail[:3])


@pytest.mark.parametrize("column", ["conv", "ids"])
def test_put_a_slice_of_each_rows_through_an_anchor_table(column):
    """put_sessions_from (a drafted step's commit): session b gets src[b, start[b] : start[b]
    + n] in one launch, as the reference's gather and put; other buffers untouched."""
    before, (anchor,), after = ple_states(2, 1), ple_states(1, 2), ple_states(2, 3)
    rows = [after[1], before[0], after[0], before[1]]
    col = 0 if column == "conv" else 1
    table = ple_table(rows, anchor)
    mine = [getattr(p, column) for p in rows]
    n = mine[0].shape[0]
    kept = getattr(anchor, column).clone()
    gen = torch.Generator().manual_seed(5)
    src = torch.randn(4, n + 3, *mine[0].shape[1:], generator=gen) * 50
    src = src.to(mine[0].dtype).to(DEVICE)
    start = torch.tensor([0, 3, 1, 2], device=DEVICE)
    want = [m.clone() for m in mine]
    rows_ref.put_sessions_from(want, src, start, n)
    triton_tables.put_sessions_from([getattr(anchor, column)] * 4, src, start, n, table, col)
    for got, w, b in zip(mine, want, range(4)):
        assert torch.equal(got, w)
        assert torch.equal(got, src[b, int(start[b]) : int(start[b]) + n])
    assert torch.equal(getattr(anchor, column), kept)


def test_put_one_row_of_each_through_a_table():
    """The recurrent state's commit: one row of [B, T, ...] per session (rows = 1)."""
    states = [torch.zeros(3, 4, 5, device=DEVICE) for _ in range(3)]
    src = torch.randn(3, 4, 3, 4, 5, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    start = torch.tensor([2, 0, 3], device=DEVICE)
    table = offsets_table([states], align=[1])
    triton_tables.put_sessions_from(states, src, start, 1, table, 0)
    for b, s in enumerate(states):
        assert torch.equal(s, src[b, int(start[b])])


def test_put_two_slices_of_each_in_one_launch():
    """A drafted step's commit of a layer's two states (`also`): the PLE conv windows and
    ids (other dtypes, other widths) through one table in one launch, each as put alone
    (and as the reference's two puts); the anchor untouched."""
    before, (anchor,), after = ple_states(2, 7), ple_states(1, 8), ple_states(2, 9)
    rows = [after[1], before[0], after[0], before[1]]
    table = ple_table(rows, anchor)
    kept = [anchor.conv.clone(), anchor.ids.clone()]
    gen = torch.Generator().manual_seed(10)
    convs = torch.randn(4, 6 + 2, 16, generator=gen).to(DEVICE)
    ids = torch.randint(0, 500, (4, 3 + 2), generator=gen).to(DEVICE)
    start = torch.tensor([0, 2, 1, 2], device=DEVICE)
    want = [(p.conv.clone(), p.ids.clone()) for p in rows]
    rows_ref.put_sessions_from(
        [w[0] for w in want], convs, start, 6, also=([w[1] for w in want], ids, start, 3, 1)
    )
    also = ([anchor.ids] * 4, ids, start, 3, 1)
    triton_tables.put_sessions_from([anchor.conv] * 4, convs, start, 6, table, 0, also=also)
    for b, (p, (conv, id_)) in enumerate(zip(rows, want)):
        s = int(start[b])
        assert torch.equal(p.conv, conv) and torch.equal(p.conv, convs[b, s : s + 6])
        assert torch.equal(p.ids, id_) and torch.equal(p.ids, ids[b, s : s + 3])
    assert torch.equal(anchor.conv, kept[0]) and torch.equal(anchor.ids, kept[1])
