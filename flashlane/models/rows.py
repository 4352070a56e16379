"""The layout of one forward: every row of every piece, flat, plus what each piece is."""

from __future__ import annotations

import array
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from flashlane.models.state import SessionState


def device_longs(values: list[int], device) -> torch.Tensor:
    """An int64 tensor of `values` on `device`. On CUDA it goes through pinned memory and
    does not wait: a copy from pageable memory makes the host wait for the stream, so the
    GPU's queue drains and the host loses its lead."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=torch.long, device=device)
    return torch.tensor(values, dtype=torch.long, pin_memory=True).to(device, non_blocking=True)


def copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """dst.copy_(src) for every pair, as one multi-tensor copy per (device, dtypes): a round's
    per-stream copies were one launch each."""
    kinds: dict[tuple, tuple[list, list]] = {}
    for d, s in zip(dsts, srcs):
        if d.numel():
            pair = kinds.setdefault((d.device, d.dtype, s.dtype), ([], []))
            pair[0].append(d)
            pair[1].append(s)
    for group in kinds.values():
        torch._foreach_copy_(*group)


@dataclass(slots=True)
class Piece:
    offset: int  # first row of this piece in the flat [N, ...] activations
    length: int
    start: int  # absolute position of the first row
    session: SessionState | None  # None: a fresh training sequence (nothing read or written)
    # Verify windows run the recurrent GDN and keep a state per row (keep = an index);
    # prompt pieces run the chunked GDN (chunks at absolute multiples of 64).
    recurrent: bool = False
    # A prompt piece that is its whole prompt (from position 0 to its end): a short one runs
    # the recurrent GDN (GatedDeltaNet.SHORT_PROMPT), in every run of its request alike.
    whole: bool = False
    # Filled by the layers during the forward: what commit() needs per layer.
    pending: dict[tuple[str, int], Any] = field(default_factory=dict)

    @property
    def rows(self) -> slice:
        return slice(self.offset, self.offset + self.length)


@dataclass(slots=True)
class Rows:
    token_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64 absolute positions
    pieces: list[Piece]
    # (B, T) when the pieces are B fresh training sequences of T rows: stateful ops batch them.
    batch: tuple[int, int] | None = None
    # per stacked group of several windows: its rows' indices, so a split is one gather
    _index: dict[tuple[int, bool], torch.Tensor] = field(default_factory=dict)
    _rope: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    _width: list[int | None] = field(default_factory=list)  # one_width(), once per forward
    _longs: dict[str, torch.Tensor] = field(default_factory=dict)  # longs(), once per forward

    @classmethod
    def training(cls, input_ids: torch.Tensor) -> Rows:
        b, t = input_ids.shape
        pos = torch.arange(t, device=input_ids.device).repeat(b)
        pieces = [Piece(offset=i * t, length=t, start=0, session=None) for i in range(b)]
        return cls(input_ids.reshape(-1), pos, pieces, batch=(b, t))

    @classmethod
    def of(cls, pieces: list[tuple], device) -> Rows:
        """pieces: (session, token ids [T] (a tensor or a list), start position, recurrent[,
        whole]) in row order (whole: Piece.whole, default False). The ids and positions go to
        the device in one copy, however many pieces, made without a Python list of the rows
        (an 8k-token prompt's lists and their conversions took ~2.5 ms of host time while the
        GPU waited)."""
        out, ids, pos, offset = [], [], [], 0
        for session, tokens, start, recurrent, *whole in pieces:
            if isinstance(tokens, torch.Tensor):
                ids.append(tokens.reshape(-1).to("cpu", torch.long))
            else:
                ids.append(
                    torch.frombuffer(array.array("q", tokens), dtype=torch.long)
                    if len(tokens)
                    else torch.zeros(0, dtype=torch.long)
                )
            t = int(ids[-1].numel())
            out.append(Piece(offset, t, start, session, recurrent, bool(whole and whole[0])))
            pos.append(torch.arange(start, start + t))
            offset += t
        both = torch.cat([torch.cat(ids), torch.cat(pos)]) if pieces else torch.zeros(0).long()
        if torch.device(device).type == "cuda":  # see device_longs: pinned, no wait
            both = both.pin_memory().to(device, non_blocking=True)
        else:
            both = both.to(device)
        return cls(both[:offset], both[offset:], out)

    def longs(self, key: str, values: Callable[[], list[int]]) -> torch.Tensor:
        """device_longs(values()) made once per forward under `key`: indices that every layer
        of the forward uses alike."""
        if key not in self._longs:
            self._longs[key] = device_longs(values(), self.token_ids.device)
        return self._longs[key]

    def stack_in(self, name: str, pieces: list[Piece], tensors) -> list[torch.Tensor]:
        """Pieces side by side: each tensor's rows [N, ...] of them, padded to the widest
        piece -> [P, width, ...], a piece's last row repeated past its length (a causal or
        row-wise op then gives each piece's rows what its call alone gives). The index
        tensors are the forward's under `name` (made once for every layer)."""
        width = max(p.length for p in pieces)
        gather = self.longs(f"{name}_gather", lambda: [
            p.offset + min(t, p.length - 1) for p in pieces for t in range(width)
        ])  # fmt: skip
        return [t.index_select(0, gather).unflatten(0, (-1, width)) for t in tensors]

    def stack_out(self, name: str, pieces: list[Piece], res: torch.Tensor, out: torch.Tensor):
        """stack_in's inverse: res [P, width, ...] into out [N, ...], each piece's real rows
        at its rows of the forward, the padded ones dropped."""
        width = res.shape[1]
        real = self.longs(f"{name}_real", lambda: [
            i * width + t for i, p in enumerate(pieces) for t in range(p.length)
        ])  # fmt: skip
        dest = self.longs(f"{name}_rows", lambda: [
            p.offset + t for p in pieces for t in range(p.length)
        ])  # fmt: skip
        out.index_copy_(0, dest, res.flatten(0, 1).index_select(0, real))

    def cos_sin(self, rotary, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """rotary.cos_sin of the rows' positions, computed once per forward."""
        if dtype not in self._rope:
            self._rope[dtype] = rotary.cos_sin(self.positions, dtype)
        return self._rope[dtype]

    def one_width(self) -> int | None:
        """T when every piece is a verify window of a session and all are T rows wide (the
        rows are then B stacked windows, [B, T] in row order), else None."""
        if not self._width:
            t = self.pieces[0].length if self.batch is None and self.pieces else None
            ok = t is not None and all(
                p.recurrent and p.session is not None and p.length == t for p in self.pieces
            )
            self._width.append(t if ok else None)
        return self._width[0]

    def split(
        self, x: torch.Tensor, stack: bool = False, prompts: bool = False
    ) -> list[torch.Tensor]:
        """[N, ...] -> per group of groups(stack, prompts) [B, T, ...] (per piece: B = 1; the
        prompt pieces together: [1, their rows, ...])."""
        if self.batch is not None:
            return [x.reshape(*self.batch, *x.shape[1:])]
        out = []
        for i, g in enumerate(self.groups(stack, prompts)):
            run, shape = _run(g), (len(g) if g[0].recurrent else 1, -1)
            if run is not None:
                out.append(x[run].unflatten(0, shape))
            else:
                out.append(x.index_select(0, self._rows_of(i, g, prompts)).unflatten(0, shape))
        return out

    def _rows_of(self, i: int, group: list[Piece], prompts: bool) -> torch.Tensor:
        if (i, prompts) not in self._index:
            ids = [r for p in group for r in range(p.offset, p.offset + p.length)]
            self._index[i, prompts] = device_longs(ids, self.token_ids.device)
        return self._index[i, prompts]

    def join(
        self, parts: list[torch.Tensor], stack: bool = False, prompts: bool = False
    ) -> torch.Tensor:
        """Inverse of split(stack, prompts): per group [B, T, ...] -> [N, ...] in row order."""
        if self.batch is not None:
            return _cat([p.reshape(-1, *p.shape[2:]) for p in parts])
        groups = self.groups(stack, prompts)
        if all(_run(g) is not None for g in groups):
            return _cat([part.flatten(0, 1) for part in parts])
        out = parts[0].new_empty(len(self.token_ids), *parts[0].shape[2:])
        for i, part in enumerate(parts):
            self.put(out, i, part, stack, prompts)
        return out

    def put(self, out: torch.Tensor, i: int, part: torch.Tensor, stack=False, prompts=False):
        """Group i of groups(stack, prompts): its part [B, T, ...] into its rows of out [N, ...]
        (join, a group at a time)."""
        g = self.groups(stack, prompts)[i]
        run = _run(g)
        if run is not None:
            out[run] = part.flatten(0, 1)
        else:
            out.index_copy_(0, self._rows_of(i, g, prompts), part.flatten(0, 1))

    def groups(self, stack: bool = False, prompts: bool = False) -> list[list[Piece]]:
        """Pieces in the groups that split() returns: one piece each; with `stack`, the verify
        windows of each width together (a layer stacks their per-stream states); with
        `prompts`, also every session's prompt piece in one group (one varlen GDN call)."""
        if self.batch is not None:
            return [self.pieces]
        if not stack:
            return [[p] for p in self.pieces]
        out: list[list[Piece]] = []
        by_width: dict[int, list[Piece]] = {}
        for p in self.pieces:
            if p.session is None:
                out.append([p])
                continue
            width = p.length if p.recurrent else (-1 if prompts else None)
            if width is None:
                out.append([p])
                continue
            if width not in by_width:
                by_width[width] = []
                out.append(by_width[width])
            by_width[width].append(p)
        return out


def _run(group: list[Piece]) -> slice | None:
    """The group's rows as one slice when they lie back to back in the flat rows, else None."""
    for a, b in itertools.pairwise(group):
        if b.offset != a.offset + a.length:
            return None
    return slice(group[0].offset, group[-1].offset + group[-1].length)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    """torch.cat of the rows, without its copy for one part (contiguous, as cat's)."""
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts, dim=0)
