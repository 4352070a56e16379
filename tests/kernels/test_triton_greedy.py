"""The greedy step's tail in one launch (kernels/rowwise/triton_greedy.py) against the torch
ops it replaces (reference.greedy_step): the first maximum of each row across the kernel's
chunks, its finite flag, the token and the position.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_greedy.py`.
"""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.rowwise import reference as ref
from tests.kernels.triton_env import DEVICE, DTYPES, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.rowwise import triton_greedy as tg  # noqa: E402


def _both(logits):
    """(out, tok, pos) of the kernel and of the reference from the same starting buffers."""
    b = logits.shape[0]
    runs = []
    for fn in (tg.greedy_step, ref.greedy_step):
        out = torch.full((b, 2), -7, dtype=torch.long, device=DEVICE)
        tok = torch.full((b,), -7, dtype=torch.long, device=DEVICE)
        pos = torch.arange(b, dtype=torch.long, device=DEVICE) * 10
        fn(logits, out, tok, pos)
        runs.append((out, tok, pos))
    return runs


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_step_is_the_first_maximum_with_its_flag(dtype):
    v = 3 * tg.CHUNK + 100  # a ragged last chunk
    g = torch.Generator(device=DEVICE).manual_seed(3)
    logits = torch.randn(7, v, generator=g, device=DEVICE).to(dtype)
    logits[1, [5, 2 * tg.CHUNK + 7, v - 1]] = 50.0  # ties in three chunks: the first wins
    logits[2, [3, tg.BLOCK + 9, tg.BLOCK + 12]] = 50.0  # ties in one chunk, two loads
    logits[2, 0] = -float("inf")  # a -inf logit, the maximum still finite
    logits[3, v - 1] = 60.0  # the maximum in the ragged chunk
    logits[4, 17] = float("nan")  # a NaN: flag 0
    logits[5, 100] = float("inf")  # an infinite maximum: flag 0
    logits[6] = -float("inf")  # nothing finite: flag 0
    (out, tok, pos), (want_out, want_tok, want_pos) = _both(logits)
    assert torch.equal(out[:, 1], want_out[:, 1])
    assert out[:, 1].tolist() == [1, 1, 1, 1, 0, 0, 0]
    finite = want_out[:, 1] == 1
    assert torch.equal(out[finite, 0], want_out[finite, 0])
    assert out[1:4, 0].tolist() == [5, 3, v - 1]
    assert torch.equal(tok, out[:, 0]) and torch.equal(want_tok, want_out[:, 0])
    assert torch.equal(pos, want_pos) and pos.tolist() == [1, 11, 21, 31, 41, 51, 61]
    assert out[5, 0].item() == 100  # the infinite maximum's id, as torch's


@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_step_runs_again_on_its_counters(dtype):
    """The row counters are left at zero: a second call (a replayed step) is right too."""
    v = 2 * tg.CHUNK
    g = torch.Generator(device=DEVICE).manual_seed(4)
    for _ in range(2):
        logits = torch.randn(2, v, generator=g, device=DEVICE).to(dtype)
        (out, _, _), (want, _, _) = _both(logits)
        assert torch.equal(out, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_draft_pick_is_the_first_maximum_into_its_column(dtype):
    """A drafted step's MTP draft d: torch's argmax of each row into drafts[:, d] (a column,
    rows K apart), the other columns untouched; a row alone gets the same id as in a batch."""
    v = 2 * tg.CHUNK + 300
    g = torch.Generator(device=DEVICE).manual_seed(5)
    logits = torch.randn(5, v, generator=g, device=DEVICE).to(dtype)
    logits[1, [9, tg.CHUNK + 4]] = 40.0  # ties across chunks: the first wins
    logits[2, v - 1] = 40.0  # the maximum in the ragged chunk
    logits[3, 0] = -float("inf")
    runs = []
    for fn in (tg.draft_pick, ref.draft_pick):
        drafts = torch.full((5, 3), -7, dtype=torch.long, device=DEVICE)
        fn(logits, drafts, 1)
        runs.append(drafts)
    got, want = runs
    assert torch.equal(got, want)
    assert got[1:3, 1].tolist() == [9, v - 1] and (got[:, [0, 2]] == -7).all()
    alone = torch.full((1, 2), -7, dtype=torch.long, device=DEVICE)
    tg.draft_pick(logits[3:4], alone, 0)
    assert alone[0, 0] == got[3, 1] and alone[0, 1] == -7


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_rounds_greedy_rows_in_one_launch_draw_as_torch(dtype):
    """A shared round's plain greedy rows (sampling.choose.greedy_on_device) through the
    kernel set's greedy_step draw the ids torch's ops draw, ties to the lower id, and leave
    out the same rows (a NaN, an infinite maximum, nothing finite), for every row or some."""
    from flashlane.sampling.choose import greedy_on_device

    v = 2 * tg.CHUNK + 50
    g = torch.Generator(device=DEVICE).manual_seed(6)
    logits = torch.randn(8, v, generator=g, device=DEVICE).to(dtype)
    logits[0, [7, tg.CHUNK + 1]] = 30.0  # a tie across chunks: the first wins
    logits[2, 11] = float("nan")
    logits[3, 40] = float("inf")
    logits[4] = -float("inf")
    logits[6, v - 1] = 30.0
    for rows in (list(range(8)), [0, 2, 3, 6], [5], []):
        got = greedy_on_device(logits, rows, tg.greedy_step)
        want = greedy_on_device(logits, rows)
        assert got == want, rows
        assert all(r not in got for r in (2, 3, 4))
    assert greedy_on_device(logits, [0, 6], tg.greedy_step) == {0: 7, 6: v - 1}
