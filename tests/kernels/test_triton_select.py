"""The indexer's mask in one launch (kernels/attention/triton_select.py) against
reference.select_mask: the same bool mask, bit for bit, for random scores, ties (equal
scores keep the lower block ids), NaN, +-0.0 and -inf scores, rows below and past the top
blocks, caches of one block and none.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_select.py`.
"""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.attention import reference as ref
from tests.kernels.triton_env import DEVICE, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.attention import triton_select, triton_select_spread  # noqa: E402
from flashlane.kernels.attention.triton_select import select_from_scores  # noqa: E402


@pytest.fixture(params=["whole", "chunks", "spread", "spread whole", "many rows"], autouse=True)
def ranking(request, monkeypatch):
    """Every test five times: rows ranked from one load (up to WHOLE blocks), every row
    through the loops over chunks (WHOLE smaller than any row here that ranks; chunks of 16
    blocks, so a row's counts and histograms add over several), every row by programs of 16
    blocks each (triton_select_spread.py), which write its mask 32 keys a step, the spread
    with rows of up to 8 blocks ranked whole by their first program, and a call of as many
    rows as SPREAD_ROWS: one program a row however long, up to the call's blocks' power of
    two (at least WHOLE, at most ROWS_WHOLE: 8) whole."""
    spread = request.param.startswith("spread") or request.param == "many rows"
    if request.param != "whole":
        monkeypatch.setattr(triton_select, "WHOLE", 8 if request.param == "spread whole" else 2)
        monkeypatch.setattr(triton_select, "CHUNK", 16)
    monkeypatch.setattr(triton_select, "SPREAD", spread)
    if spread:  # programs of 16 blocks a row, masks 32 keys a step
        monkeypatch.setattr(triton_select, "SPREAD_KEYS", 0)
        monkeypatch.setattr(triton_select_spread, "MASK_KEYS", 32)
    if request.param == "many rows":  # every call past the spread's rows

        def no_spread(*args):
            raise AssertionError("a call of SPREAD_ROWS rows took the spread")

        monkeypatch.setattr(triton_select, "SPREAD_ROWS", 1)
        monkeypatch.setattr(triton_select, "ROWS_WHOLE", 8)
        monkeypatch.setattr(triton_select_spread, "rank_and_mask", no_spread)
    return request.param


def _want(scores, pos, num_keys, block, top):
    """The reference mask for these scores (its scores_of hook returns them), on the CPU:
    its sort ranks a NaN above every number whatever its sign bit (CUDA's sort ranked a
    negative NaN otherwise on the H200)."""
    b, t, nb = scores.shape
    iq, keys = torch.zeros(b, t, 1, 1), torch.zeros(b, nb, 1)
    cpu = scores.cpu()
    want = ref.select_mask(iq, keys, pos.cpu(), num_keys, block, top, lambda q, k: cpu, False)
    return want.to(scores.device)


def _check(scores, pos, num_keys, block, top):
    got = select_from_scores(scores, pos, num_keys, block, top)
    want = _want(scores, pos, num_keys, block, top)
    assert got.dtype == torch.bool and got.shape == want.shape
    assert torch.equal(got, want), (got.int() - want.int()).nonzero()[:5]


def test_prompt_pieces_rank_their_blocks_whole(ranking):
    """A prompt piece's programs rank up to its blocks' power of two in registers (not
    ROWS_WHOLE at any length: 8k rows took 1.6x longer so), a decode call up to WHOLE."""
    if ranking != "whole":
        pytest.skip("the module's own settings")
    rows = triton_select.SPREAD_ROWS
    assert triton_select.rows_whole(rows - 1, 8192) == triton_select.WHOLE
    assert triton_select.rows_whole(rows, 2048) == triton_select.WHOLE == 4096
    assert triton_select.rows_whole(rows, 5000) == triton_select.ROWS_WHOLE == 8192
    assert triton_select.rows_whole(4 * rows, 65536) == 8192


@pytest.mark.parametrize("seed", [0, 1])
def test_random_scores_every_position(seed):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    b, t, block, top, nb = 2, 3, 4, 5, 14
    num_keys = nb * block + 3  # an incomplete tail past the last block
    scores = torch.randn(b, t, nb, generator=g, device=DEVICE)
    for start in range(0, num_keys - t + 1, 5):  # rows below and past `top` complete blocks
        pos = torch.arange(start, start + t, device=DEVICE).repeat(b, 1)
        pos[1] = pos[1].flip(0)
        _check(scores, pos, num_keys, block, top)


def test_ties_nan_zeros_and_infinities():
    block, top, nb = 2, 4, 12
    s = torch.tensor([[1.0, 3.0, 3.0, 0.0, -0.0, 3.0, float("nan"), -float("inf"),
                       3.0, 2.0, float("nan"), 0.0]], device=DEVICE)[None]  # fmt: skip
    for p in (7, 13, 20, 23):
        _check(s, torch.tensor([[p]], device=DEVICE), nb * block, block, top)
    flat = torch.zeros(1, 1, nb, device=DEVICE)  # all tied: the lowest ids win
    _check(flat, torch.tensor([[23]], device=DEVICE), nb * block, block, top)
    _check(-flat, torch.tensor([[23]], device=DEVICE), nb * block, block, top)  # all -0.0


def test_many_blocks_cross_chunks(ranking):
    if ranking == "spread whole":
        pytest.skip("rows past 8 blocks: the spread's own ranking, as above")
    g = torch.Generator(device=DEVICE).manual_seed(3)
    block, top, nb = 4, 37, 2100  # more blocks than one chunk of the kernel's loops
    scores = torch.randint(-3, 4, (1, 2, nb), generator=g, device=DEVICE).float()  # many ties
    pos = torch.tensor([[nb * block - 1, 900]], device=DEVICE)
    _check(scores, pos, nb * block, block, top)


def test_no_blocks_and_one_block():
    _check(torch.zeros(1, 2, 0, device=DEVICE), torch.tensor([[0, 2]], device=DEVICE), 3, 4, 2)
    s = torch.ones(1, 1, 1, device=DEVICE)
    _check(s, torch.tensor([[5]], device=DEVICE), 6, 4, 1)


def test_signed_zeros_tie_and_negative_nan_ranks_first():
    block, top = 1, 2
    # -0.0 at id 0 ties +0.0 at id 1: the lower id wins the second place after 1.0
    s = torch.tensor([[[-0.0, 0.0, 1.0, -1.0, -2.0]]], device=DEVICE)
    _check(s, torch.tensor([[4]], device=DEVICE), 5, block, top)
    # a NaN with its sign bit set, made from its bits (CUDA's negation of a NaN may clear it)
    neg_nan = torch.tensor(-4194304, dtype=torch.int32, device=DEVICE).view(torch.float32)
    assert torch.isnan(neg_nan)
    assert neg_nan.view(torch.int32) < 0
    s = torch.tensor([[[0.5, 2.0, 0.0, 1.0, 3.0]]], device=DEVICE)
    s[0, 0, 2] = neg_nan  # a NaN, whatever its sign, ranks above every number
    _check(s, torch.tensor([[4]], device=DEVICE), 5, block, top)
