"""A drafted lone call's load in CUDA graphs: the MTP head absorbing a stream's waiting cells
(its prompt's rows, or the cells its plain steps queued) as a drafted step's window cells
absorb theirs (runner/draft_step.cells: each row at its own position, reading and writing its
session's head cache through the size tables), in buckets of rows, one graph each.

An eager head forward over a 20-cell queue took 2.69 ms on the H200 (e97e8a5): ~37 launches,
their host time. A replay is a few launches' host time.

The cells' bits are not the head forward's (decode kernels, not prompt ones). The head's
cells steer only how many drafts land, never a token (runner/draft_step.py's exactness).
Rows past the queue (a bucket's pad) sit at the positions after it, in the same session:
they write cells past the head's length, which the next step's window writes again before
any row reads them, as a drafted step's rows past the kept ones do. A queue longer than the
largest bucket goes in pieces; a piece whose bucket would reach past the session's capacity
runs eagerly, its rows alone.
"""

from __future__ import annotations

import torch

from flashlane.models.flashnext import FlashNext
from flashlane.models.state import SessionState
from flashlane.runner.draft_step import cells
from flashlane.runner.graphs import bucket_of

__all__ = ["ROWS", "AbsorbBuffers", "Absorber", "absorb_cells"]

ROWS = (8, 16, 32, 64, 128, 256)  # an absorb's buckets of cells, one graph each


@torch.no_grad()
def absorb_cells(model: FlashNext, session, res, ids, pos, units, tables=None) -> None:
    """Cells of rows res [N, hc*H] with next ids [N] into `session`'s head cache at
    positions pos[0] + i (pos: [1] on the device); units: ones [>= N, hc]. tables: the
    head layers' tables of the rows by ("rows", ("mtp", j)) (graphed, from the anchor:
    `session` is then the anchor), or None (the kernels make their own)."""
    n, heads = ids.shape[0], range(len(model.mtp.layers))
    at = torch.empty(n, dtype=pos.dtype, device=pos.device)
    inv = model.rotary.inv(at.device)
    cos, sin, *once = model.kernels.step_angles(
        pos, inv, res.dtype, model.cfg.indexer_block, window=at
    )
    caches = [[session.mtp[j]] * n for j in heads]
    rows = [None if tables is None else tables[("rows", ("mtp", j))] for j in heads]
    cells(model, res, ids, caches, (at, cos, sin, once), rows, units, False)


class AbsorbBuffers:
    """An absorb's static inputs for a bucket of `rows` cells of one session: res [rows,
    hc*H], ids [rows], pos [1] (the first cell's position), units [rows, hc] ones. Graphed:
    `table` in a drafted step's layout (runner/lone_buffers.SizeTables.of with depth rows - 1:
    the session's row, then its row once per cell), written before a call."""

    def __init__(self, rows: int, hc: int, width: int, dtype, device: torch.device):
        self.size, self.depth, self.rows = 1, rows - 1, rows
        self.table: torch.Tensor | None = None
        self.table_keys: list = []
        self.res = torch.zeros(rows, width, dtype=dtype, device=device)
        self.ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        self.units = torch.ones(rows, hc, dtype=dtype, device=device)
        self.warm = False

    def key(self, ids: tuple[int, ...]) -> tuple:
        return ("absorb", self.rows)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.res, self.ids, self.pos

    def tables(self) -> dict:
        return {("rows", key): t[1:] for key, t in zip(self.table_keys, self.table)}

    def step(self, model: FlashNext, sessions: list[SessionState], tables) -> None:
        absorb_cells(model, sessions[0], self.res, self.ids, self.pos, self.units, tables)


class Absorber:
    """What absorbs one stream's waiting cells for the lone driver (`driver`,
    runner/lone.LoneDriver): called as MtpDrafter.absorb_waiting's `cells`."""

    def __init__(self, driver):
        self.driver = driver
        self.index = {id(s): i for i, s in enumerate(driver.sessions)}
        self.io: dict[int, AbsorbBuffers] = {}
        self.num_graphed = self.num_eager = 0  # pieces absorbed each way

    def __call__(self, session: SessionState, res: torch.Tensor, ids: list[int]) -> None:
        """The cells of rows res [N, hc*H] with next ids `ids` into session's head cache
        from its mtp_length on (the caller moves the length)."""
        drv, pos = self.driver, session.mtp_length
        for a in range(0, len(ids), ROWS[-1]):
            piece = ids[a : a + ROWS[-1]]
            n = len(piece)
            rows = bucket_of(n, list(ROWS))
            if drv.use_graphs and pos + rows <= session.capacity:
                self._replay(session, res[a : a + n], piece, pos, rows)
                self.num_graphed += 1
            else:
                dev = res.device
                at = torch.tensor([pos], device=dev)
                units = torch.ones(n, drv.model.cfg.hc_count, dtype=res.dtype, device=dev)
                step = (torch.tensor(piece, device=dev), at, units)
                absorb_cells(drv.model, session, res[a : a + n], *step)
                self.num_eager += 1
            pos += n

    def buffers(self, rows: int) -> AbsorbBuffers:
        """The graphed absorb's buffers of a bucket of `rows` cells."""
        io = self.io.get(rows)
        if io is None:
            drv, cfg = self.driver, self.driver.model.cfg
            width = cfg.hc_count * cfg.hidden_size
            io = AbsorbBuffers(rows, cfg.hc_count, width, drv.model.dtype, drv.device)
            io.table = drv.size_tables.device_table(1, rows - 1)
            io.table_keys = drv.size_tables.draft_keys
            self.io[rows] = io
        return io

    def all_buffers(self) -> list[AbsorbBuffers]:
        """Every bucket's buffers (LoneDriver.capture_all captures them at engine start)."""
        return [self.buffers(rows) for rows in ROWS]

    def _replay(self, session, res, ids: list[int], pos: int, rows: int) -> None:
        drv, sid, n = self.driver, self.index[id(session)], len(ids)
        io = self.buffers(rows)
        io.table.copy_(drv.size_tables.of((sid,), 1, rows - 1), non_blocking=True)
        io.res[:n].copy_(res)
        host = torch.tensor([*ids, pos], pin_memory=drv.is_cuda)
        io.ids[:n].copy_(host[:n], non_blocking=True)
        io.pos.copy_(host[n:], non_blocking=True)
        drv.runner((sid,), io)()
