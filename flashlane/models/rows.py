"""The layout of one forward: every row of every piece, flat, plus what each piece is."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from flashlane.models.state import SessionState


@dataclass(slots=True)
class Piece:
    offset: int  # first row of this piece in the flat [N, ...] activations
    length: int
    start: int  # absolute position of the first row
    session: SessionState | None  # None: a fresh training sequence (nothing read or written)
    # Verify windows run the recurrent GDN and keep a state per row (keep = an index);
    # prompt pieces run the chunked GDN (chunks at absolute multiples of 64).
    recurrent: bool = False
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

    @classmethod
    def training(cls, input_ids: torch.Tensor) -> Rows:
        b, t = input_ids.shape
        pos = torch.arange(t, device=input_ids.device).repeat(b)
        pieces = [Piece(offset=i * t, length=t, start=0, session=None) for i in range(b)]
        return cls(input_ids.reshape(-1), pos, pieces, batch=(b, t))

    @classmethod
    def of(cls, pieces: list[tuple[SessionState, torch.Tensor, int, bool]], device) -> Rows:
        """pieces: (session, token ids [T], start position, recurrent) in row order."""
        out, ids, pos, offset = [], [], [], 0
        for session, tokens, start, recurrent in pieces:
            t = int(tokens.numel())
            out.append(Piece(offset, t, start, session, recurrent))
            ids.append(tokens.to(device=device, dtype=torch.long).reshape(-1))
            pos.append(torch.arange(start, start + t, device=device))
            offset += t
        return cls(torch.cat(ids), torch.cat(pos), out)

    def split(self, x: torch.Tensor) -> list[torch.Tensor]:
        """[N, ...] -> per piece [1, T, ...] (or one [B, T, ...] for a training batch)."""
        if self.batch is not None:
            return [x.reshape(*self.batch, *x.shape[1:])]
        return [x[p.rows].unsqueeze(0) for p in self.pieces]

    def join(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Inverse of split: per piece [1, T, ...] (or [B, T, ...]) -> [N, ...]."""
        return torch.cat([p.reshape(-1, *p.shape[2:]) for p in parts], dim=0)

    def groups(self) -> list[list[Piece]]:
        """Pieces in the groups that split() returns."""
        return [self.pieces] if self.batch is not None else [[p] for p in self.pieces]
