"""A drafted lone call's load (runner/absorb.py) on the CPU: the MTP head absorbing a stream's
waiting cells as window cells, each at its own position, in pieces, writes the head's cache
as one head forward over the same cells does (within float64's rounding: other kernels),
and moves the head's length as far."""

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


@pytest.mark.parametrize("cells,rows", [(5, absorb.ROWS), (70, (8, 16, 32))])
def test_window_cells_write_the_head_cache_as_a_head_forward(tiny_ckpt, monkeypatch, cells, rows):
    """70 cells with a largest bucket of 32: three pieces, the last one short."""
    monkeypatch.setattr(absorb, "ROWS", rows)
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[1]  # 70 tokens: past the first indexer blocks
    base, first = prefilled(model, cfg, prompt)
    torch.manual_seed(0)
    res = torch.randn(cells, cfg.hc_count * cfg.hidden_size, dtype=torch.float64)
    ids = [(7 * i + 3) % cfg.vocab_size for i in range(cells)]
    got = []
    for graphs_of in (None, "absorber"):
        s = type(base).empty(cfg, 512, torch.float64, torch.float64)
        copy_session(base, s, cfg.indexer_block)
        s.mtp_length = 0
        drafter = MtpDrafter(model, confidence=0.0)
        drafter.absorb_later(0, res.clone(), [first, *ids[:-1]], ids[-1], None)
        driver = LoneDriver(model, [s], drafter=drafter)
        cells_of = driver.drafting.absorber if graphs_of else None
        drafter.absorb_waiting([0], {0: s}, [first], cells=cells_of)
        assert s.mtp_length == cells and drafter.queued(0) == 0
        got.append(head_cache(s, cells))
        if graphs_of:
            pieces = -(-cells // rows[-1])
            assert driver.drafting.absorber.num_eager == pieces  # no graphs on the CPU
    for a, b in zip(*got):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
