"""Gated full attention (Qwen3-Next, Qwen3.5): QSA's heads without the indexer.

q_proj emits each head's query and its output gate side by side ([q_h, gate_h] per head);
q and k are zero-centred RMS-normed per head, then roped on their leading rotary dims; every
row attends to every key up to its own position (kernels.causal_attention: positions, no
mask tensor); out = o_proj(attn * sigmoid(gate)).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from flashlane.kernels import REFERENCE, Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.norms import Stacked
from flashlane.models.layers.qsa_attention import (
    add_heads,
    padded_caches,
    piece_stacks,
    stack_in,
    stack_out,
)
from flashlane.models.rows import Piece, Rows, copy_all
from flashlane.models.state import AttnCache, SessionState


class GatedAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, cache_of: Callable[[SessionState], AttnCache]):
        super().__init__()
        self.cfg, self.cache_of = cfg, cache_of
        add_heads(self, cfg)
        self.ops: Kernels = REFERENCE  # the model's use_kernels points it at the device's
        self.in_proj = Stacked(self.q_proj, self.k_proj, self.v_proj)

    def forward(self, x: torch.Tensor, rows: Rows, rotary, kernels: Kernels) -> torch.Tensor:
        """x: [N, H] -> [N, H]; each piece's keys and values are written to its session."""
        q, gate, k, v = self.project(x, *rows.cos_sin(rotary, x.dtype))
        return self.output(self.attend(q, k, v, rows, kernels), gate)

    def project(self, x: torch.Tensor, cos, sin) -> tuple[torch.Tensor, ...]:
        """The row-wise part: x [N, H] -> (q [N, Hq, D] normed and roped, output gate
        [N, Hq, D], k [N, Hkv, D] normed and roped, v [N, Hkv, D])."""
        cfg, n, d = self.cfg, x.shape[0], self.cfg.head_dim
        qg, k, v = self.in_proj(x)
        qg = qg.reshape(n, cfg.num_attention_heads, 2 * d)
        q, gate = qg[..., :d], qg[..., d:]
        q, k = self.ops.norm_rope_heads([
            (q, self.q_norm.weight, self.q_norm.eps),
            (k.reshape(n, cfg.num_kv_heads, d), self.k_norm.weight, self.k_norm.eps),
        ], cos, sin)  # fmt: skip
        return q, gate, k, v.reshape(n, cfg.num_kv_heads, d)

    def output(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        """The gated output projection: o, gate [N, Hq, D] -> [N, H]."""
        return self.o_proj(self.ops.gated_heads(o, gate))

    def attend(self, q, k, v, rows: Rows, kernels: Kernels) -> torch.Tensor:
        """Keys written to each piece's session, then each row's attention -> o [N, Hq, D].
        Training batches attend within themselves; the round's verify windows in one call,
        its short prompt pieces (two or more) in another, padded as QSA pads them
        (qsa_attention.piece_stacks, padded_caches); longer prompt pieces one at a time."""
        scale = self.cfg.head_dim**-0.5
        if rows.batch is not None:
            pos = rows.positions.view(rows.batch)
            q4, k4, v4 = (t.unflatten(0, rows.batch) for t in (q, k, v))
            return kernels.causal_attention(q4, k4, v4, scale, pos).flatten(0, 1)
        o = q.new_empty(q.shape)
        windows, prompts = piece_stacks(rows)
        stacks = ([windows] if windows else []) + ([prompts] if len(prompts) > 1 else [])
        stacked = {id(p) for s in stacks for p in s}
        for p in rows.pieces:
            if id(p) not in stacked:
                pos = rows.positions[p.rows][None]
                cache, e, _ = self._write_all([p], k[p.rows][None], v[p.rows][None])[0]
                keys, values = cache.keys(e)[None], cache.values(e)[None]
                o[p.rows] = kernels.causal_attention(q[p.rows][None], keys, values, scale, pos)[0]
        for s in stacks:
            self._attend_stack(s, q, k, v, o, rows, kernels)
        return o

    def _attend_stack(self, pieces: list[Piece], q, k, v, out, rows: Rows, kernels):
        """Pieces of one kind (verify windows, or short prompt pieces) in one call: queries
        padded to the widest piece (each piece's last row repeated, its result dropped),
        caches padded with zeros to the longest; a row sees its own keys up to its position
        only, and the causal kernel's tiles never depend on T, B or L, so its bits are the
        ones its piece would get alone."""
        qw, kw, vw, pos = stack_in(rows, pieces, (q, k, v, rows.positions))
        keys, values, _, _ = padded_caches(self._write_all(pieces, kw, vw))
        res = kernels.causal_attention(qw, keys, values, self.cfg.head_dim**-0.5, pos)
        stack_out(rows, pieces, res, out)

    def _write_all(self, pieces: list[Piece], k, v) -> list[tuple]:
        """Piece i's rows k[i], v[i] written at its positions (one multi-tensor copy) -> per
        piece (its cache, length L, no complete blocks: 0), as qsa_attention.padded_caches
        reads them."""
        dsts, srcs = [], []
        for i, p in enumerate(pieces):
            cache, s, e = self.cache_of(p.session), p.start, p.start + p.length
            to, of = cache.row_copies(s, e, k[i, : p.length], v[i, : p.length])
            dsts, srcs = dsts + to, srcs + of
        copy_all(dsts, srcs)
        return [(self.cache_of(p.session), p.start + p.length, 0) for p in pieces]
