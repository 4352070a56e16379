"""Kept prompt states: a copy of a session's state at a mark, and putting one back.

An entry of the prompt cache (`flashlane.sessions.prompt_cache`) holds, for a session whose
committed length is the mark n: attention rows [0, n) of K, V and raw indexer keys and the
n // block pooled block keys of every attention layer (not the session's whole capacity); the
GDN conv windows and recurrent states; the PLE tails and n-gram ids; the MTP head's cache rows
and its last row's residual, whose next token is not known yet (only when the stream drafted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from flashlane.models.state import AttnCache, SessionState


@dataclass(frozen=True, slots=True)
class KeptRows:
    """Rows [0, n) of one attention cache: every buffer AttnCache.tensors names (an 8-bit
    cache's scales too), the block keys' n // block rows, the others' n."""

    rows: tuple[torch.Tensor, ...]

    @classmethod
    def of(cls, c: AttnCache, n: int, block: int) -> KeptRows:
        return cls(tuple(t[: _count(c, t, n, block)].clone() for t in c.tensors()))

    def put(self, c: AttnCache) -> None:
        for dst, src in zip(c.tensors(), self.rows, strict=True):
            dst[: src.shape[0]] = src


def _count(c: AttnCache, t: torch.Tensor, n: int, block: int) -> int:
    return n // block if t is c.block_keys else n


@dataclass(frozen=True, slots=True)
class KeptState:
    length: int  # the mark: committed target positions
    attn: list[KeptRows]  # per attention layer, in the session's order
    gdn: list[tuple[torch.Tensor, torch.Tensor]]  # per GDN layer: (conv window, recurrent state)
    ple: list[tuple[torch.Tensor, torch.Tensor]]  # per PLE layer: (conv tail, n-gram ids)
    mtp: list[KeptRows]  # per MTP layer: rows [0, mtp_length)
    mtp_length: int
    dangling: torch.Tensor | None  # [hc*H] the MTP cell waiting for the token at `length`

    @property
    def has_drafts(self) -> bool:
        return self.dangling is not None

    def nbytes(self) -> int:
        ts = [t for r in (*self.attn, *self.mtp) for t in r.rows]
        ts += [t for pair in (*self.gdn, *self.ple) for t in pair]
        ts += [self.dangling] if self.dangling is not None else []
        return sum(t.numel() * t.element_size() for t in ts)


def keep(s: SessionState, block: int, dangling: torch.Tensor | None) -> KeptState:
    """Copy the session's committed state (its MTP cells absorbed up to the last one)."""
    n, m = s.length, s.mtp_length if dangling is not None else 0
    return KeptState(
        length=n,
        attn=[KeptRows.of(c, n, block) for c in s.attn.values()],
        gdn=[(g.conv.clone(), g.recurrent.clone()) for g in s.gdn.values()],
        ple=[(p.conv.clone(), p.ids.clone()) for p in s.ple.values()],
        mtp=[KeptRows.of(c, m, block) for c in s.mtp] if dangling is not None else [],
        mtp_length=m,
        dangling=dangling.clone() if dangling is not None else None,
    )


def put(kept: KeptState, s: SessionState) -> None:
    """Make the session hold the kept state (a session of any capacity that fits it)."""
    if kept.length > s.capacity:
        raise ValueError(f"a session of {s.capacity} positions cannot hold {kept.length}")
    for rows, c in zip(kept.attn, s.attn.values()):
        rows.put(c)
    for rows, c in zip(kept.mtp, s.mtp):
        rows.put(c)
    for (conv, rec), g in zip(kept.gdn, s.gdn.values()):
        g.conv.copy_(conv)
        g.recurrent.copy_(rec)
    for (conv, ids), p in zip(kept.ple, s.ple.values()):
        p.conv.copy_(conv)
        p.ids.copy_(ids)
    s.length, s.mtp_length, s.last_residual = kept.length, kept.mtp_length, None


def kept_bytes(s: SessionState, block: int, length: int, drafts: bool, hidden: int) -> int:
    """What `keep` takes for a session like `s` at `length` (MTP rows: length - 1)."""

    def rows(c: AttnCache, n: int) -> int:  # a row's bytes of each buffer (8-bit: + scales)
        return sum(_count(c, t, n, block) * t[0].numel() * t.element_size() for t in c.tensors())

    small = [t for g in s.gdn.values() for t in (g.conv, g.recurrent)]
    small += [t for p in s.ple.values() for t in (p.conv, p.ids)]
    total = sum(rows(c, length) for c in s.attn.values())
    total += sum(t.numel() * t.element_size() for t in small)
    if drafts:
        total += sum(rows(c, length - 1) for c in s.mtp) + hidden * s.attn_dtype().itemsize
    return total
