"""A drafted lone call's load (runner/absorb.py) on the CPU: the MTP head absorbing streams'
waiting cells as window cells, each row at its own position in its own session, packed into
calls of at most the largest bucket, writes each head cache as one head forward over the
same cells does (within float64's rounding: other kernels), and moves each head's length as
far."""

import pytest
import torch

from flashlane.drafting.mtp import MtpDrafter
from flashlane.models.loader import load_checkpoint
from flashlane.runner import absorb
from flashlane.runner.backend import copy_session
from flashlane.runner.lone import LoneDriver
from tests.runner.test_exact import prompts
from tests.runner.test_lone import prefilled


def head_cache(s, n: int) -> list[torch.Tensor]:
    """The head caches' rows below n, and their complete pooled blocks."""
    out = []
    for c in s.mtp:
        blocks = n // (c.k.shape[0] // c.block_keys.shape[0])
        out += [c.k[:n], c.v[:n], c.index_keys[:n], c.block_keys[:blocks]]
    return out


def queued(model, cfg, base, first, cells: list[int], seed: int = 0):
    """Copies of `base` with no head cells, copy i with `cells[i]` random cells waiting in a
    drafter: (sessions, drafter)."""
    drafter = MtpDrafter(model, confidence=0.0)
    g = torch.Generator().manual_seed(seed)
    sessions = []
    for i, n in enumerate(cells):
        s = type(base).empty(cfg, 512, torch.float64, torch.float64)
        copy_session(base, s, cfg.indexer_block)
        s.mtp_length = 0
        res = torch.randn(n, cfg.hc_count * cfg.hidden_size, generator=g, dtype=torch.float64)
        ids = [(7 * j + 3 + i) % cfg.vocab_size for j in range(n)]
        drafter.absorb_later(i, res, [first, *ids[:-1]], ids[-1], None)
        sessions.append(s)
    return sessions, drafter


@pytest.mark.parametrize(
    "cells,rows,calls",
    [
        ([5], absorb.ROWS, 1),
        ([70], (8, 16, 32), 3),  # three pieces of one stream, the last short
        ([20, 9, 30], (8, 16, 32), 2),  # 20 and 9 in one call (29 rows), then 30
    ],
)
def test_window_cells_write_the_head_caches_as_a_head_forward(
    tiny_ckpt, monkeypatch, cells, rows, calls
):
    monkeypatch.setattr(absorb, "ROWS", rows)
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    base, first = prefilled(model, cfg, prompts()[1])  # 70 tokens: past the first blocks
    got = []
    for windowed in (False, True):
        sessions, drafter = queued(model, cfg, base, first, cells)
        driver = LoneDriver(model, sessions, drafter=drafter)
        streams, by_id = list(range(len(cells))), dict(enumerate(sessions))
        absorber = driver.drafting.absorber if windowed else None
        drafter.absorb_waiting(streams, by_id, [first] * len(cells), cells=absorber)
        assert [s.mtp_length for s in sessions] == cells
        assert all(drafter.queued(i) == 0 for i in streams)
        got.append([head_cache(s, n) for s, n in zip(sessions, cells)])
        if windowed:
            assert (absorber.num_graphed, absorber.num_eager) == (0, calls)  # the CPU: eager
    for want, have in zip(*got):
        for a, b in zip(want, have):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
