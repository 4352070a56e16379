"""A drafted lone call's load in CUDA graphs: the MTP head absorbing its streams' waiting cells
(a prompt's rows, or the cells plain steps queued) as a drafted step's window cells absorb
theirs (runner/draft_step.cells: each row at its own position, reading and writing its own
session's head cache through a table), every stream's cells packed into calls of up to 64
rows, in buckets of rows, one graph each.

Eager head forwards over the queues took 2.69 / 5.52 / 10.85 ms at 1 / 4 / 16 streams on the
H200 (e97e8a5): ~37 launches a forward, their host time, most of a drafted call's load. A
replay is a few copies and one launch from the host.

The cells' bits are not the head forward's (decode kernels, not prompt ones). The head's
cells steer only how many drafts land, never a token (runner/draft_step.py's exactness).
Rows past a call's cells (a bucket's pad) name the pad session (runner/lone_buffers.py), at
positions from 0, which no stream reads; every kernel of a cell is row-invariant.
"""

from __future__ import annotations

import torch

from flashlane.kernels.session_tables import attn_table
from flashlane.models.flashnext import FlashNext
from flashlane.models.state import SessionState
from flashlane.runner.draft_step import cells
from flashlane.runner.graphs import bucket_of

__all__ = ["ROWS", "AbsorbBuffers", "Absorber", "absorb_cells"]

# an absorb's buckets of cells, one graph each: at most DECODE_ROWS (kernels/linear/tiles.py),
# the decode tiles a drafted step's cells run (larger calls would take the prompt tiles)
ROWS = (8, 16, 32, 64)


@torch.no_grad()
def absorb_cells(model: FlashNext, sessions: list, res, ids, at, units, tables=None) -> None:
    """Cells of rows res [N, hc*H] with next ids [N]: row i into sessions[i]'s head cache at
    position at[i] (at: [N] on the device); units: ones [>= N, hc]. tables: the head layers'
    tables of the rows by ("rows", ("mtp", j)) (graphed, from the anchor: `sessions` are
    then the anchor), or None (the kernels make their own)."""
    heads = range(len(model.mtp.layers))
    inv = model.rotary.inv(at.device)
    cos, sin, *once = model.kernels.step_angles(at, inv, res.dtype, model.cfg.indexer_block)
    caches = [[s.mtp[j] for s in sessions] for j in heads]
    rows = [None if tables is None else tables[("rows", ("mtp", j))] for j in heads]
    cells(model, res, ids, caches, (at, cos, sin, once), rows, units, False)


class AbsorbBuffers:
    """A graphed absorb's static inputs for a bucket of `rows` cells: res [rows, hc*H], ids
    and positions `at` ([2, rows]: one copy from the host), units [rows, hc] ones, and the
    head layers' tables [heads, rows, TABLE_WIDTH] (each row's session from the anchor;
    `pad` [heads, 1, TABLE_WIDTH]: the pad session's row). `size` 1: LoneDriver's step
    protocol (its steps' sessions: the anchor)."""

    def __init__(self, rows: int, pad: torch.Tensor, hc: int, width: int, dtype, device):
        self.size, self.rows = 1, rows
        self.res = torch.zeros(rows, width, dtype=dtype, device=device)
        self.ids_at = torch.zeros(2, rows, dtype=torch.long, device=device)
        self.units = torch.ones(rows, hc, dtype=dtype, device=device)
        self.pad = pad.expand(-1, rows, -1)
        self.table = torch.zeros(self.pad.shape, dtype=torch.long, device=device)
        self.warm = False

    def key(self, ids: tuple[int, ...]) -> tuple:
        return ("absorb", self.rows)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        return self.res, self.ids_at

    def tables(self) -> dict:
        return {("rows", ("mtp", j)): t for j, t in enumerate(self.table)}

    def pad_table(self, tables) -> torch.Tensor:
        """Every row the pad session's (a capture's warm-up: LoneDriver._warm)."""
        return self.pad

    def step(self, model: FlashNext, sessions: list[SessionState], tables) -> None:
        ids, at = self.ids_at
        absorb_cells(model, sessions * self.rows, self.res, ids, at, self.units, tables)


class Absorber:
    """What absorbs streams' waiting cells for the lone driver (`driver`,
    runner/lone.LoneDriver): MtpDrafter.absorb_waiting's `cells`."""

    def __init__(self, driver):
        self.driver = driver
        self.io: dict[int, AbsorbBuffers] = {}
        self.rows_of: dict[int, torch.Tensor] = {}  # id(session) -> its tables' row [heads, W]
        self.num_graphed = self.num_eager = 0  # calls each way

    def __call__(self, queues: list[tuple[SessionState, torch.Tensor, list[int]]]) -> None:
        """Each (session, rows [n, hc*H], next ids) into the session's head cache from its
        mtp_length on (the caller moves the lengths), ROWS[-1] rows a call."""
        call, count = [], 0
        for s, res, ids in queues:
            for a in range(0, len(ids), ROWS[-1]):
                piece = (s, res[a : a + ROWS[-1]], ids[a : a + ROWS[-1]], s.mtp_length + a)
                if count + len(piece[2]) > ROWS[-1]:
                    self._run(call)
                    call, count = [], 0
                call.append(piece)
                count += len(piece[2])
        if call:
            self._run(call)

    def _run(self, pieces: list) -> None:
        drv = self.driver
        n = sum(len(ids) for _, _, ids, _ in pieces)
        rows = bucket_of(n, list(ROWS)) if drv.use_graphs else n
        pad = rows - n
        ids = [t for _, _, piece, _ in pieces for t in piece] + [0] * pad
        at = [p + i for _, _, piece, p in pieces for i in range(len(piece))] + list(range(pad))
        res = [r for _, r, _, _ in pieces]
        if not drv.use_graphs:
            dev = res[0].device
            ids_at = torch.tensor([ids, at], device=dev)
            units = torch.ones(n, drv.model.cfg.hc_count, dtype=res[0].dtype, device=dev)
            sessions = [s for s, _, piece, _ in pieces for _ in piece]
            absorb_cells(drv.model, sessions, torch.cat(res), *ids_at, units)
            self.num_eager += 1
            return
        io = self.buffers(rows)
        table = [self._rows(s).expand(-1, len(piece), -1) for s, _, piece, _ in pieces]
        table = torch.cat([*table, self._rows(drv.size_tables.pad).expand(-1, pad, -1)], 1)
        pinned = drv.is_cuda  # (tests run the tables' path on the CPU through Triton's interpreter)
        io.table.copy_(table.pin_memory() if pinned else table, non_blocking=True)
        io.ids_at.copy_(torch.tensor([ids, at], pin_memory=pinned), non_blocking=True)
        torch.cat(res, out=io.res[:n])
        drv.runner((), io)()
        self.num_graphed += 1

    def _rows(self, s: SessionState) -> torch.Tensor:
        """The session's row of each head layer's table, from the anchor [heads, 1, W]."""
        row = self.rows_of.get(id(s))
        if row is None:
            anchor = self.driver.size_tables.anchor
            row = torch.stack([attn_table([c], a, host=True) for c, a in zip(s.mtp, anchor.mtp)])
            self.rows_of[id(s)] = row
        return row

    def buffers(self, rows: int) -> AbsorbBuffers:
        """The graphed absorb's buffers of a bucket of `rows` cells."""
        io = self.io.get(rows)
        if io is None:
            drv, cfg = self.driver, self.driver.model.cfg
            pad, width = self._rows(drv.size_tables.pad), cfg.hc_count * cfg.hidden_size
            args = (cfg.hc_count, width, drv.model.dtype, drv.device)
            io = self.io[rows] = AbsorbBuffers(rows, pad, *args)
        return io

    def all_buffers(self) -> list[AbsorbBuffers]:
        """Every bucket's buffers (LoneDriver.capture_all captures them at engine start)."""
        return [self.buffers(rows) for rows in ROWS]
