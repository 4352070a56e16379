"""lone_buffers.warm_up on every kind of buffers a lone capture warms (the plain and keyed
steps' StepBuffers: tests/sampling/test_adjusted_draw.py): its step sees the pad session's
tables and zeroed inputs, and the inputs and tables are put back after. The absorb's buffers
have no `tok` (H200 at 1a68afd: every lone capture failed on it and the steps ran eagerly,
7% of the roofline); and a capture that fails later is logged."""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.tables import TABLE_WIDTH
from flashlane.models.state import SessionState
from flashlane.runner.absorb import AbsorbBuffers
from flashlane.runner.draft_step import DraftBuffers
from flashlane.runner.lone_buffers import warm_up


def absorb_buffers():
    pad = torch.full((2, 1, TABLE_WIDTH), 7, dtype=torch.long)
    io = AbsorbBuffers(rows=4, pad=pad, hc=2, width=6, dtype=torch.float32, device="cpu")
    return io, io.pad_table(None)


def draft_buffers():
    io = DraftBuffers(3, 2, hc=2, width=6, dtype=torch.float32, device=torch.device("cpu"))
    io.table = torch.zeros(2, 3 * 4, TABLE_WIDTH, dtype=torch.long)
    return io, torch.full_like(io.table, 7)


@pytest.mark.parametrize("make", [absorb_buffers, draft_buffers])
def test_warm_up_puts_the_inputs_and_tables_back(make):
    io, pad = make()
    for x in (*io.inputs(), io.table):
        x.copy_(torch.randint(1, 100, x.shape) if x.dtype == torch.long else torch.randn(x.shape))
    before = [x.clone() for x in (*io.inputs(), io.table)]
    seen = []
    warm_up(io, pad, lambda: seen.append([x.clone() for x in (*io.inputs(), io.table)]))
    ((*inputs, table),) = seen
    assert not any(x.any() for x in inputs) and (table == 7).all()
    assert all(torch.equal(x, y) for x, y in zip((*io.inputs(), io.table), before))
    assert io.warm


def test_a_capture_that_fails_later_says_so(tiny_ckpt, monkeypatch):
    """A lone capture that fails after the engine started (a new size, a new draw shape)
    turns the steps eager for good: the driver logs why, in the words the engine's start
    line and gpu_check's serve step use ("failed, steps run eagerly")."""
    from flashlane.models.loader import load_checkpoint
    from flashlane.runner.lone import LoneDriver

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float32)
    s = SessionState.empty(cfg, 64, torch.float32, torch.float32, "cpu")
    driver, lines = LoneDriver(model, [s]), []
    driver.log = lines.append
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)  # the GPU's, not here
    driver._give_up(RuntimeError("capture broke"))
    assert not driver.use_graphs and driver.failed == "RuntimeError: capture broke"
    assert lines == ["flashlane: lone step graphs failed, steps run eagerly: " + driver.failed]
