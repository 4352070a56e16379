"""lone_buffers.warm_up on every kind of buffers a lone capture warms: its step sees the pad
session's tables and zeroed inputs, and the inputs and tables are put back after. The absorb's
buffers have no `tok` (H200 at 1a68afd: every lone capture failed on it and the steps ran
eagerly, 7% of the roofline)."""

from __future__ import annotations

import torch

from flashlane.kernels.tables import TABLE_WIDTH
from flashlane.runner.absorb import AbsorbBuffers
from flashlane.runner.lone_buffers import warm_up


def test_warm_up_of_an_absorb_puts_its_inputs_and_tables_back():
    pad = torch.full((2, 1, TABLE_WIDTH), 7, dtype=torch.long)
    io = AbsorbBuffers(rows=4, pad=pad, hc=2, width=6, dtype=torch.float32, device="cpu")
    io.res.normal_()
    io.ids_at.random_(1, 100)
    io.table.random_(1, 100)
    before = [x.clone() for x in (*io.inputs(), io.table)]
    seen = []

    def step():
        seen.append([x.clone() for x in (*io.inputs(), io.table)])

    warm_up(io, io.pad_table(None), step)
    ((res, ids_at, table),) = seen
    assert not res.any() and not ids_at.any() and (table == 7).all()
    assert all(torch.equal(x, y) for x, y in zip((*io.inputs(), io.table), before))
    assert io.warm
