"""A drafted step's verdict in one launch (kernels/rowwise/triton_accept.py) against the
reference: kept rows after leading drafts that land on finite rows, the draws and flags,
the pending token, the marks and the positions; NaN and infinite rows end a window."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DEVICE, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.rowwise import reference, triton_accept

pytestmark = needs_triton


def buffers(b: int, t: int):
    on = dict(dtype=torch.long, device=DEVICE)
    return (
        torch.zeros(b, 2 * t + 1, **on),
        torch.zeros(b, **on),
        torch.arange(b, **on) * 10,
        torch.zeros(3, b, **on),
    )


@pytest.mark.parametrize("t", [2, 3, 4, 7])
def test_accept_window_matches_the_reference(t):
    b = 6
    gen = torch.Generator().manual_seed(t)
    ids = torch.randint(0, 4, (b, t), generator=gen)
    drafts = ids[:, : t - 1].clone()  # every draft the draw before it: all land ...
    drafts[1, 0] += 1  # ... but session 1's first, session 2's last
    drafts[2, -1] += 1
    drafts[4] = torch.randint(0, 4, (t - 1,), generator=gen)
    top = torch.randn(b, t, generator=gen)
    top[3, 0] = float("nan")  # a NaN row: its draw ends the window
    top[5, min(1, t - 2)] = float("inf")
    ids, drafts, top = ids.to(DEVICE), drafts.to(DEVICE), top.to(DEVICE)
    firsts = torch.arange(b, device=DEVICE) * t
    want, got = buffers(b, t), buffers(b, t)
    reference.accept_window(ids, top, drafts, firsts, *want[:2], want[2], want[3])
    triton_accept.accept_window(ids, top, drafts, firsts, *got[:2], got[2], got[3])
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    kept = want[0][:, 2 * t]
    assert kept[0] == t and kept[1] == 1 and kept[3] == 1
    assert kept[2] == t - 1 or t == 2
    assert torch.equal(want[2], torch.arange(b, device=DEVICE) * 10 + kept)


def test_accept_window_reads_and_writes_the_window_views():
    """DraftBuffers' tok and drafts are views of one window [B, T] (a step embeds it with no
    cat): the kernel reads the drafts and writes the pending token where they lie."""
    b, t = 3, 4
    gen = torch.Generator().manual_seed(9)
    ids = torch.randint(0, 4, (b, t), generator=gen)
    top = torch.randn(b, t, generator=gen)
    firsts = torch.arange(b) * t
    runs = []
    for fn in (reference.accept_window, triton_accept.accept_window):
        window = torch.cat([torch.full((b, 1), 9), ids[:, : t - 1]], dim=1)
        window[1, 2] += 1  # session 1 keeps two rows
        window, bufs = window.to(DEVICE), buffers(b, t)
        fn(ids.to(DEVICE), top.to(DEVICE), window[:, 1:], firsts.to(DEVICE),
           bufs[0], window[:, 0], bufs[2], bufs[3])  # fmt: skip
        runs.append((window, bufs))
    (want, want_bufs), (got, got_bufs) = runs
    assert torch.equal(got, want) and all(map(torch.equal, got_bufs, want_bufs))
    assert got[:, 0].tolist() == [ids[0, t - 1], ids[1, 1], ids[2, t - 1]]
    assert torch.equal(got[:, 1:], want[:, 1:]) and got_bufs[0][:, 2 * t].tolist() == [t, 2, t]
