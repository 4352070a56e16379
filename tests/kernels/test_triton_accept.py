"""A drafted step's verdict in one launch (kernels/rowwise/triton_accept.py) against the
reference: each window row's draw (the first maximum of its logits, across the kernel's
chunks), kept rows after leading drafts that land on finite rows, the draws and flags, the
pending token, the marks and the positions; NaN and infinite rows end a window.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_accept.py`.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DEVICE, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.rowwise import reference, triton_accept
from flashlane.kernels.rowwise.triton_greedy import CHUNK

pytestmark = needs_triton

V = CHUNK + 300  # two chunks a row, the last ragged


def buffers(b: int, t: int):
    """(out, pos, marks, ids) as a step leaves them before its verdict."""
    on = dict(dtype=torch.long, device=DEVICE)
    return (
        torch.full((b, 2 * t + 1), -7, **on),
        torch.arange(b, **on) * 10,
        torch.full((3, b), -7, **on),
        torch.full((b * t,), -7, **on),
    )


def logits_of(draws: torch.Tensor, seed: int) -> torch.Tensor:
    """Logits [B*T, V] whose first maximum in each row is draws [B, T]'s (ties: a later
    copy of the maximum, across the chunks)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(draws.numel(), V, generator=gen)
    rows = torch.arange(draws.numel())
    logits[rows, draws.flatten()] = 20.0
    logits[rows, CHUNK + 7] = 20.0  # a tie in the second chunk: the first wins
    return logits


def both(logits, drafts, b, t, tok_of=None):
    """Each implementation's (out, pos, marks, ids, tok) from the same starting buffers."""
    runs = []
    firsts = torch.arange(b, device=DEVICE) * t
    for fn in (reference.accept_window, triton_accept.accept_window):
        out, pos, marks, ids = buffers(b, t)
        tok = torch.full((b,), -7, dtype=torch.long, device=DEVICE) if tok_of is None else None
        window = None
        if tok_of is not None:  # DraftBuffers' tok and drafts: views of one window [B, T]
            window = torch.cat([tok_of[:, None], drafts], dim=1).to(DEVICE)
            tok, d = window[:, 0], window[:, 1:]
        else:
            d = drafts.to(DEVICE)
        fn(logits.to(DEVICE), d, firsts, out, tok, pos, marks, ids)
        runs.append((out, pos, marks, ids, tok if window is None else window))
    return runs


@pytest.mark.parametrize("t", [2, 3, 4])
def test_accept_window_matches_the_reference(t):
    b = 5
    gen = torch.Generator().manual_seed(t)
    draws = torch.randint(0, CHUNK, (b, t), generator=gen)
    drafts = draws[:, : t - 1].clone()  # every draft the draw before it: all land ...
    drafts[1, 0] += 1  # ... but session 1's first, session 2's last
    drafts[2, -1] += 1
    drafts[4] = torch.randint(0, 4, (t - 1,), generator=gen)
    logits = logits_of(draws, t)
    logits[3 * t + min(1, t - 2), 11] = float("inf")  # an infinite row: its draw ends it
    want, got = both(logits, drafts, b, t)
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    out, pos = got[0], got[1]
    kept = out[:, 2 * t]
    assert kept[0] == t and kept[1] == 1 and kept[3] == min(1, t - 2) + 1
    assert kept[2] == t - 1 or t == 2
    assert torch.equal(pos, torch.arange(b, device=DEVICE) * 10 + kept)
    assert out[3, min(1, t - 2)] == 11 and out[3, t + min(1, t - 2)] == 0


def test_a_nan_row_ends_its_window_as_the_reference():
    """A row with a NaN: flag 0 and the same kept rows, marks and positions (its draw may
    be another id than torch's, as greedy_step's); every other row's draw is the same."""
    b, t = 2, 3
    draws = torch.tensor([[4, 9, 2], [5, 6, 7]])
    drafts = draws[:, :2].clone()
    logits = logits_of(draws, 1)
    logits[1, 30] = float("nan")  # session 0's second row
    want, got = both(logits, drafts, b, t)
    (out, pos, marks, ids, tok), (w_out, w_pos, w_marks, w_ids, w_tok) = got, want
    assert torch.equal(out[:, t:], w_out[:, t:]) and out[:, 2 * t].tolist() == [2, 3]
    assert out[0, t : 2 * t].tolist() == [1, 0, 1]
    assert torch.equal(pos, w_pos) and torch.equal(marks, w_marks)
    finite = torch.ones(b * t, dtype=torch.bool)
    finite[1] = False
    assert torch.equal(ids[finite], w_ids[finite]) and ids.tolist()[2:] == [2, 5, 6, 7]
    assert torch.equal(tok[1], w_tok[1])


def test_accept_window_reads_and_writes_the_window_views():
    """DraftBuffers' tok and drafts are views of one window [B, T] (a step embeds it with no
    cat): the kernel reads the drafts and writes the pending token where they lie; it runs
    again on its counters (a replayed step)."""
    b, t = 3, 4
    gen = torch.Generator().manual_seed(9)
    draws = torch.randint(0, CHUNK, (b, t), generator=gen)
    drafts = draws[:, : t - 1].clone()
    drafts[1, 1] += 1  # session 1 keeps two rows
    for _ in range(2):
        (*want, w_window), (*got, window) = both(logits_of(draws, 9), drafts, b, t, draws[:, 0])
        assert torch.equal(window, w_window) and all(map(torch.equal, got, want))
        assert window[:, 0].tolist() == [draws[0, t - 1], draws[1, 1], draws[2, t - 1]]
        assert torch.equal(window[:, 1:], drafts.to(DEVICE))
        assert got[0][:, 2 * t].tolist() == [t, 2, t]
