"""The lone driver's buffers (runner/lone.py): a plain step's static inputs and outputs and
the pinned ring the host reads (`StepBuffers`), and the session tables that let one graph of
B rows serve any B sessions (`SizeTables`).

A graph of a step reads and writes its sessions through tables of element offsets from an
anchor session's buffers (models.state's tables; the anchor is the largest session, so
attention spans any session's capacity), written into the step's buffers before a call.
Rows past the call's streams name a pad session, which no stream reads: every op of a step
is row-invariant, so the streams' bits do not depend on the pad rows.
"""

from __future__ import annotations

import torch

from flashlane.models.config import ModelConfig
from flashlane.models.flashnext import FlashNext
from flashlane.models.state import TABLE_WIDTH, SessionState
from flashlane.runner.lone_step import session_tables, step
from flashlane.sampling.lone_draw import KeyedDraw

__all__ = ["MAX_TABLES", "RING", "SizeTables", "StepBuffers", "posts_to_pinned", "warm_up"]

RING = 4  # landed tokens waiting to be read (two in flight need two)
MAX_TABLES = 1024  # the session tables of plain steps kept on the host, by tuple of sessions


class SizeTables:
    """The anchor (the largest session), the pad session, and the host's tables of steps by
    tuple of sessions: a plain step's (`keys`), a drafted step's (`draft_keys`: the MTP
    head's caches too)."""

    def __init__(
        self, cfg: ModelConfig, sessions: list[SessionState], reach: int, device: torch.device
    ):
        """reach: the positions one call may move a pad row on (its steps' tokens)."""
        self.sessions, self.device, self.pinned = sessions, device, device.type == "cuda"
        like = max(sessions, key=lambda s: s.capacity)
        # room for a call's steps from position 0
        block = cfg.indexer_block
        capacity = max(2, -(-(reach + 1) // block)) * block
        self.pad = SessionState.empty(
            cfg, capacity, like.attn_dtype(), like.state_dtype(), device, kv_fp8=like.kv_fp8
        )
        # the largest of all, the pad too: a step's attention spans the anchor's keys and
        # blocks (a pad larger than the anchor wrote past the scores: an illegal address)
        self.anchor = max([*sessions, self.pad], key=lambda s: s.capacity)
        self.keys = list(session_tables([self.anchor], self.anchor, host=True))
        self.draft_keys = list(session_tables([self.anchor], self.anchor, host=True, mtp=True))
        self.host: dict[tuple, torch.Tensor] = {}

    def device_table(self, size: int, depth: int = 0) -> torch.Tensor:
        """A step's table buffer of `size` sessions [layers, rows, TABLE_WIDTH] (`of`'s
        layout: by `keys`, or for a drafted step of `depth` drafts by `draft_keys`)."""
        n = len(self.draft_keys if depth else self.keys)
        rows = size * (depth + 2) if depth else size
        return torch.zeros(n, rows, TABLE_WIDTH, dtype=torch.long, device=self.device)

    def of(self, ids: tuple[int, ...], size: int, depth: int = 0) -> torch.Tensor:
        """The tables of a step of these sessions padded to `size` rows, every layer's
        stacked as `device_table` holds them, pinned; kept by tuple of sessions (a call's
        few milliseconds of offsets, made once). A drafted step's (`depth` > 0) have
        [layers, size * (depth + 2), TABLE_WIDTH]: the sessions' rows, then each session's
        row once per window row (depth + 1 times: runner/draft_step.DraftBuffers.tables),
        made here, so that no step copies them."""
        key = (depth, size, ids)
        table = self.host.get(key)
        if table is None:
            if len(self.host) >= MAX_TABLES:
                self.host.clear()
            rows = [self.sessions[i] for i in ids] + [self.pad] * (size - len(ids))
            tables = session_tables(rows, self.anchor, host=True, mtp=depth > 0)
            table = torch.stack(list(tables.values()))
            if depth:
                table = torch.cat([table, table.repeat_interleave(depth + 1, dim=1)], dim=1)
            table = self.host[key] = table.pin_memory() if self.pinned else table
        return table


def posts_to_pinned(model: FlashNext, device: torch.device) -> bool:
    """Whether the model's kernels store a step's verdict into pinned memory here (the
    Triton ones, once probed: `triton_rows.posts_to_pinned`)."""
    if model.kernels.name != "triton":
        return False
    from flashlane.kernels.rowwise.triton_rows import posts_to_pinned

    return posts_to_pinned(device)


def warm_up(io, pad: torch.Tensor, run) -> None:
    """A step of io (run()) before its size's first capture, on a side stream with every row
    the pad session's (`pad`: its tables) and the inputs zeroed, so that every kernel is
    compiled and the allocator warm; io's inputs and the call's tables are put back after."""
    loaded = io.table.clone()
    io.table.copy_(pad)
    saved = [x.clone() for x in io.inputs()]
    for x in io.inputs():
        x.zero_()
    if loaded.is_cuda:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            run()
        torch.cuda.current_stream().wait_stream(side)
    else:  # tests: no graphs on the CPU
        run()
    for live, value in zip(io.inputs(), saved):
        live.copy_(value)
    io.table.copy_(loaded)
    io.warm = True


class StepBuffers:
    """A step's static inputs and outputs for B sessions, and the pinned ring the host reads;
    with `draw`, the keyed draw of the streams (its kernels' shape is part of a graph's key,
    and a step of each shape runs once outside a capture first: `warm`)."""

    def __init__(
        self,
        b: int,
        max_steps: int,
        width: int,
        dtype,
        device: torch.device,
        draw: KeyedDraw | None = None,
    ):
        on = dict(dtype=torch.long, device=device)
        self.size = b  # rows a step runs
        # graphed: every layer's session table [layers, b, TABLE_WIDTH], offsets from the
        # driver's anchor (by table_keys), written before a call's steps
        self.table: torch.Tensor | None = None
        self.table_keys: list = []
        self.tok, self.pos = torch.zeros(b, **on), torch.zeros(b, **on)
        self.out, self.k = torch.zeros(b, 2, **on), torch.zeros(1, **on)
        self.rows = torch.zeros(max_steps, b, width, dtype=dtype, device=device)
        self.ring = torch.zeros(RING, b, 2, dtype=torch.long, pin_memory=device.type == "cuda")
        self.draw = draw
        self.warmed: set[tuple] = set()  # the draw shapes a step has run with outside a capture
        self.depth = 0  # no drafts (runner/draft_step.DraftBuffers carry some)
        self.posts = False  # whether its step stores out into the ring (LoneDriver.posts)

    @property
    def warm(self) -> bool:
        return self._shape() in self.warmed

    @warm.setter
    def warm(self, value: bool) -> None:
        if value:
            self.warmed.add(self._shape())

    def _shape(self) -> tuple:
        return () if self.draw is None else self.draw.key

    def key(self, ids: tuple[int, ...]) -> tuple:
        """The step's graph's key: its size, with a session table (any sessions); else the
        sessions' ids; keyed: after the draw's shape."""
        which = ("size", self.size) if self.table is not None else ids
        return which if self.draw is None else ("keyed", *self.draw.key, *which)

    def inputs(self) -> tuple[torch.Tensor, ...]:
        """What a step reads and moves on (a warm-up step puts them back): with the keyed
        draw's own (the penalized rows' counts)."""
        return self.tok, self.pos, self.k, *(self.draw.moved() if self.draw is not None else ())

    def pad_table(self, tables: SizeTables) -> torch.Tensor:
        """`table` with every row the pad session's (a warm-up step's: `warm_up`)."""
        return tables.of((), self.size)

    def tables(self, sessions: list[SessionState] | None = None) -> dict:
        if self.table is not None:
            return dict(zip(self.table_keys, self.table))
        return session_tables(sessions)

    def step(self, model: FlashNext, sessions: list[SessionState], tables) -> None:
        step(
            model,
            sessions,
            self.tok,
            self.pos,
            self.out,
            (self.rows, self.k),
            tables,
            self.draw,
            self.ring if self.posts else None,
        )
