"""QSA sparse attention: gated multi-head attention whose keys a block indexer selects."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from flashlane.kernels import REFERENCE, Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.norms import RMSNorm, Stacked, linear
from flashlane.models.layers.rotary import Rotary
from flashlane.models.rows import Piece, Rows, copy_all
from flashlane.models.state import AttnCache, SessionState


class Indexer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.index_qk_proj = linear(
            cfg.hidden_size, (cfg.indexer_n_heads + 1) * cfg.indexer_head_dim
        )
        self.q_layernorm = RMSNorm(cfg.indexer_head_dim, cfg.rms_eps)
        self.k_layernorm = RMSNorm(cfg.indexer_head_dim, cfg.rms_eps)
        self.ops: Kernels = REFERENCE  # FlashNext.use_kernels points it at the device's

    def project(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [N, H] -> (queries [N, Hi, Di] normed and roped, raw keys [N, Di])."""
        return self.split(self.index_qk_proj(x), cos, sin)

    def split(self, qk: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """The projection qk [N, (Hi+1)*Di] -> (queries normed and roped, raw keys)."""
        q, raw = self.heads(qk)
        return self.ops.norm_rope_heads([q], cos, sin)[0], raw

    def heads(self, qk: torch.Tensor) -> tuple[tuple, torch.Tensor]:
        """The projection qk [N, (Hi+1)*Di] -> (the queries' part for norm_rope_heads: the
        raw queries [N, Hi, Di] where they lie, their norm's weight and eps; raw keys)."""
        di, norm = self.cfg.indexer_head_dim, self.q_layernorm
        return (qk[:, :-di].reshape(qk.shape[0], -1, di), norm.weight, norm.eps), qk[:, -di:]

    def block_keys(self, raw: torch.Tensor, first_block: int, rotary: Rotary) -> torch.Tensor:
        """raw keys of whole blocks [B, nb*block, Di] -> pooled, normed, roped [B, nb, Di]."""
        blk, norm = self.cfg.indexer_block, self.k_layernorm
        start = first_block * blk  # the blocks' first positions, in one launch
        pos = torch.arange(start, start + raw.shape[1] // blk * blk, blk, device=raw.device)
        cos, sin = rotary.cos_sin(pos, raw.dtype)
        return self.ops.block_keys(raw, cos, sin, norm.weight, norm.eps, blk)


def add_heads(module: nn.Module, cfg: ModelConfig) -> None:
    """The gated attention heads QSA and the siblings' full attention share: q_proj (each
    head's query and output gate side by side), k_proj, v_proj, o_proj and the per-head
    q_norm and k_norm, under the checkpoint's names."""
    h, d = cfg.hidden_size, cfg.head_dim
    module.q_proj = linear(h, cfg.num_attention_heads * d * 2)
    module.k_proj = linear(h, cfg.num_kv_heads * d)
    module.v_proj = linear(h, cfg.num_kv_heads * d)
    module.o_proj = linear(cfg.num_attention_heads * d, h)
    module.q_norm = RMSNorm(d, cfg.rms_eps)
    module.k_norm = RMSNorm(d, cfg.rms_eps)


class QSAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, cache_of: Callable[[SessionState], AttnCache]):
        super().__init__()
        self.cfg, self.cache_of = cfg, cache_of
        add_heads(self, cfg)
        self.indexer = Indexer(cfg)
        self.ops: Kernels = REFERENCE  # FlashNext.use_kernels points it at the device's
        self.in_proj = Stacked(self.q_proj, self.k_proj, self.v_proj, self.indexer.index_qk_proj)

    def forward(
        self, x: torch.Tensor, rows: Rows, rotary: Rotary, kernels: Kernels
    ) -> torch.Tensor:
        q, gate, k, v, iq, raw = self.project(x, *rows.cos_sin(rotary, x.dtype))
        return self.output(self.attend(q, k, v, iq, raw, rows, rotary, kernels), gate)

    def project(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, ...]:
        """The row-wise part: x [N, H] -> (q [N, Hq, D] normed and roped, output gate,
        k [N, Hkv, D] normed and roped, v, indexer queries, raw indexer keys)."""
        cfg, n, d = self.cfg, x.shape[0], self.cfg.head_dim
        qg, k, v, iqk = self.in_proj(x)
        qg = qg.reshape(n, cfg.num_attention_heads, 2 * d)
        q, gate = qg[..., :d], qg[..., d:]
        iq, raw = self.indexer.heads(iqk)
        # the three norms and ropes in one op (one launch on CUDA, where six ran at ~1 us each)
        q, k, iq = self.ops.norm_rope_heads([
            (q, self.q_norm.weight, self.q_norm.eps),
            (k.reshape(n, cfg.num_kv_heads, d), self.k_norm.weight, self.k_norm.eps),
            iq,
        ], cos, sin)  # fmt: skip
        v = v.reshape(n, cfg.num_kv_heads, d)
        return q, gate, k, v, iq, raw

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """The gated output projection: o, gate [N, Hq, D] -> [N, H]."""
        return self.o_proj(self.ops.gated_heads(o, gate))

    def attend(self, q, k, v, iq, raw, rows: Rows, rotary: Rotary, kernels: Kernels):
        """Keys written to each piece's session, then each row's attention -> o [N, Hq, D]."""
        stacks = [s for s in piece_stacks(rows) if len(s) > 1]
        if rows.batch is not None or not stacks:
            parts = zip(
                rows.split(q), rows.split(k), rows.split(v), rows.split(iq),
                rows.split(raw), rows.split(rows.positions), rows.groups(),
            )  # fmt: skip
            return rows.join([self._attend(*part, rotary, kernels) for part in parts])
        o = q.new_empty(q.shape)
        stacked = {id(p) for s in stacks for p in s}
        for p in rows.pieces:  # the pieces of no stack, one at a time
            if id(p) not in stacked:
                one = (t[p.rows][None] for t in (q, k, v, iq, raw, rows.positions))
                o[p.rows] = self._attend(*one, [p], rotary, kernels)[0]
        for s in stacks:
            self._attend_windows(s, (q, k, v, iq, raw, rows.positions), o, rows, rotary, kernels)
        return o

    def _attend_windows(self, windows: list[Piece], flat, out, rows: Rows, rotary, kernels):
        """Every verify window of the round in one call, or every short prompt piece:
        queries padded to the widest (each piece's last row repeated, its results dropped),
        caches padded to the longest. A query row's result depends on its own row, mask and
        keys alone, and its walk stops at its tile's last row's position (a repeated row's),
        so it is the one the piece would get by itself. The index tensors are the round's
        (every attention layer shares them) and the per-stream copies are multi-tensor
        copies."""
        split = windows[0].recurrent
        q, k, v, iq, raw, pos = stack_in(rows, windows, flat)
        cached = self._write_all(windows, k, v, raw, rotary, rows)
        keys, values, block_keys, nk = padded_caches(cached)
        cfg, blk = self.cfg, self.cfg.indexer_block
        # verify windows are decode rows: the indexer's scores take their tile (split)
        top = cfg.indexer_top_blocks
        mask = kernels.select_mask(iq, block_keys, pos, nk, blk, top, decode=split)
        scale = cfg.head_dim**-0.5
        res = kernels.attention(q, keys, values, mask, scale, positions=pos, split=split)
        stack_out(rows, windows, res, out)

    def _attend(self, q, k, v, iq, raw, pos, group: list[Piece], rotary, kernels: Kernels):
        cfg, blk = self.cfg, self.cfg.indexer_block
        if group[0].session is None:
            keys, values, nk = k, v, k.shape[1]
            block_keys = self.indexer.block_keys(raw[:, : nk // blk * blk], 0, rotary)
        else:
            keys, values, block_keys, nk = self._write(group[0], k[0], v[0], raw[0], rotary)
        split = group[0].recurrent  # a verify window: the decode walk (attention's `split`)
        top = cfg.indexer_top_blocks
        mask = kernels.select_mask(iq, block_keys, pos, nk, blk, top, decode=split)
        scale = cfg.head_dim**-0.5
        return kernels.attention(q, keys, values, mask, scale, positions=pos, split=split)

    def _write(self, piece: Piece, k, v, raw, rotary: Rotary):
        """Write the piece's keys at their positions; recompute blocks it completes ->
        (keys, values, block keys, length), an 8-bit cache's dequantized (AttnCache.keys)."""
        cache, e, nb = self._write_all([piece], k[None], v[None], raw[None], rotary)[0]
        return cache.keys(e)[None], cache.values(e)[None], cache.block_keys[None, :nb], e

    def _write_all(self, pieces: list[Piece], k, v, raw, rotary: Rotary, rows=None) -> list:
        """Each piece i's rows k[i], v[i], raw[i] written at its positions (one multi-tensor
        copy for all), then the pooled keys of the blocks each completes, every piece's in one
        launch (`_complete_all`) -> per piece (its cache, its length, its complete blocks):
        padded_caches' entries. rows: the round's (a stack's); None for one piece."""
        dsts, srcs = [], []
        for i, p in enumerate(pieces):
            cache, s, e = self.cache_of(p.session), p.start, p.start + p.length
            to, of = cache.row_copies(s, e, k[i, : p.length], v[i, : p.length], raw[i, : p.length])
            dsts, srcs = dsts + to, srcs + of
        copy_all(dsts, srcs)
        return self._complete_all(pieces, rotary, rows)

    def _complete_all(self, pieces: list[Piece], rotary: Rotary, rows: Rows | None) -> list:
        """The blocks the pieces complete, in a fixed number of launches, not a few a piece:
        their raw keys side by side, pooled, normed and roped at each block's own position in
        one block_keys call (a program a block: each block's bits are those it gets alone),
        then one multi-tensor copy into the caches. The positions are the round's (every
        attention layer of the forward shares them); without rows (one piece) one arange."""
        blk, norm = self.cfg.indexer_block, self.indexer.k_layernorm
        spans = [(self.cache_of(p.session), p.start // blk, (p.start + p.length) // blk)
                 for p in pieces]  # fmt: skip
        fresh = [(c, b0, b1) for c, b0, b1 in spans if b1 > b0]
        if fresh:
            parts = [c.index_rows(b0 * blk, b1 * blk) for c, b0, b1 in fresh]
            raw = torch.cat(parts) if len(parts) > 1 else parts[0]
            if rows is None:  # one piece: its blocks' first positions
                ((_, b0, b1),) = fresh
                pos = torch.arange(b0 * blk, b1 * blk, blk, device=raw.device)
            else:
                pos = rows.longs(f"block_starts_{_kind(pieces)}", lambda: [
                    b * blk for _, b0, b1 in fresh for b in range(b0, b1)
                ])  # fmt: skip
            cos, sin = rotary.cos_sin(pos, raw.dtype)
            keys = self.indexer.ops.block_keys(raw[None], cos, sin, norm.weight, norm.eps, blk)[0]
            copy_all([c.block_keys[b0:b1] for c, b0, b1 in fresh],
                     list(keys.split([b1 - b0 for _, b0, b1 in fresh])))  # fmt: skip
        return [(c, p.start + p.length, b1) for (c, _, b1), p in zip(spans, pieces)]


# prompt pieces up to this many rows attend in one call (padded to the widest: a long piece
# beside short ones would make them all as wide); longer ones alone
STACK_PROMPT_ROWS = 256


def piece_stacks(rows: Rows) -> list[list[Piece]]:
    """The pieces that attend together: the sessions' verify windows, and their prompt pieces
    of at most STACK_PROMPT_ROWS rows."""
    windows, prompts = [], []
    for p in rows.pieces:
        if p.session is not None and p.recurrent:
            windows.append(p)
        elif p.session is not None and p.length <= STACK_PROMPT_ROWS:
            prompts.append(p)
    return [windows, prompts]


def stack_in(rows: Rows, pieces: list[Piece], tensors) -> list[torch.Tensor]:
    """A stack's rows of each tensor, padded to its widest piece (Rows.stack_in; one name a
    kind of stack)."""
    return rows.stack_in(f"attend_{_kind(pieces)}", pieces, tensors)


def stack_out(rows: Rows, pieces: list[Piece], res: torch.Tensor, out: torch.Tensor) -> None:
    """A stack's results into out, the padded rows dropped (Rows.stack_out)."""
    rows.stack_out(f"attend_{_kind(pieces)}", pieces, res, out)


def _kind(pieces: list[Piece]) -> str:
    return "windows" if pieces[0].recurrent else "prompts"


def padded_caches(written: list[tuple]) -> tuple:
    """Several streams' (cache, length, complete blocks) as one batch (keys, values, block
    keys, longest length): each stream's rows, then zeros to the longest. The mask never
    lets a row see past its own position, the zero keys and values of the padding contribute
    exactly nothing, and padded blocks are never valid for the indexer, so a row's result is
    its alone (DESIGN.md section 1). An 8-bit cache's rows are dequantized into the batch
    stream by stream (AttnCache.keys: the values it always reads), no round-wide copies."""
    nk = max(n for _, n, _ in written)
    nb = max(blocks for *_, blocks in written)
    c0 = written[0][0]
    shape = (len(written), nk, *c0.k.shape[1:])
    keys = torch.zeros(shape, dtype=c0.block_keys.dtype, device=c0.k.device)
    values = torch.zeros_like(keys)
    block_keys = c0.block_keys.new_zeros(len(written), nb, c0.block_keys.shape[-1])
    dsts, srcs = [], []
    for i, (c, n, blocks) in enumerate(written):
        dsts.append(block_keys[i, :blocks])
        srcs.append(c.block_keys[:blocks])
        if c.fp8:
            keys[i, :n], values[i, :n] = c.keys(n), c.values(n)
        else:
            dsts += [keys[i, :n], values[i, :n]]
            srcs += [c.k[:n], c.v[:n]]
    copy_all(dsts, srcs)
    return keys, values, block_keys, nk
