"""Flash Next (qwen4_exp): embeddings -> hc streams -> decoder blocks -> mixer -> lm_head.

The forward takes a flat batch of rows from many pieces (prompt pieces and verify windows of
different streams, each with its own session) and returns the pre-mixer residual; logits are
computed only for the rows that draw. `commit` keeps a piece's first rows and drops the rest.
"""

from __future__ import annotations

import torch
from torch import nn

from flashlane.kernels import REFERENCE, Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.decoder import DecoderLayer
from flashlane.models.layers.hyper_connection import HyperConnection
from flashlane.models.layers.mtp import MtpHead
from flashlane.models.layers.norms import GatedRMSNorm, Linear, RMSNorm, Stacked, linear
from flashlane.models.layers.rotary import Rotary
from flashlane.models.rows import Piece, Rows, copy_all
from flashlane.models.state import SessionState


class FlashNext(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, i, kind) for i, kind in enumerate(cfg.layer_types)
        )
        self.hyper_connection_mixer = HyperConnection(
            h, cfg.hc_count, cfg.hc_lowrank, cfg.rms_eps, inject=False
        )
        self.lm_head = linear(h, cfg.vocab_size)
        self.mtp = MtpHead(cfg) if cfg.num_mtp_layers else None
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta)
        self.kernels: Kernels = REFERENCE
        self.graphs = None  # runner.graphs.Graphs on CUDA: replays of the row-count-only parts

    def use_kernels(self, kernels: Kernels) -> FlashNext:
        """Point every op of the model (linears, norms, mixers, experts) at `kernels`, and
        stack the linears that read the same input into one weight each (norms.Stacked)."""
        self.kernels = kernels
        self.rotary.op = kernels.cos_sin
        for m in self.modules():
            for stacked in [v for v in vars(m).values() if isinstance(v, Stacked)]:
                stacked.stack()
            if hasattr(m, "ops"):
                m.ops = kernels
            if isinstance(m, Linear):
                m.op = kernels.linear
            elif isinstance(m, RMSNorm):
                m.op = kernels.rms_norm
            elif isinstance(m, GatedRMSNorm):
                m.op = kernels.gated_rms_norm
        if self.embed_tokens.weight.is_cuda:  # the stacks' old tensors (WithShared's experts)
            torch.cuda.empty_cache()
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def residual(self, rows: Rows) -> torch.Tensor:
        """All rows through every block -> the pre-mixer residual [N, hc*H]."""
        # the embedding rows on every stream in one launch (embedding, then repeat)
        r = self.kernels.embed_rows(self.embed_tokens.weight, rows.token_ids, self.cfg.hc_count)
        for layer in self.layers:
            r = layer(r, rows, self.rotary, self.kernels, self.graphs)
        return r

    def logits(self, r: torch.Tensor) -> torch.Tensor:
        """Pre-mixer residual rows [M, hc*H] -> fp32 logits [M, V]."""
        return self.head_logits(r).float()

    def head_logits(self, r: torch.Tensor, xn: torch.Tensor | None = None) -> torch.Tensor:
        """The head's logits [M, V] in the model's dtype (`logits` without the fp32 copy);
        xn: the mixer's norm of r, where the last write made it."""
        return self.lm_head(self.hyper_connection_mixer.read(r, xn)[0])

    def mtp_cells(
        self, residual: torch.Tensor, next_ids: torch.Tensor, rows: Rows
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP cells for rows at cell positions: (logits [N, V] fp32, output residual [N, hc*H])."""
        assert self.mtp is not None, "this checkpoint has no MTP head"
        hidden, out = self.mtp(
            residual, self.embed_tokens(next_ids), rows, self.rotary, self.kernels
        )
        return self.lm_head(hidden).float(), out

    def forward_train(self, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids [B, T] from position 0 -> (logits [B, T, V], residual [B, T, hc*H])."""
        b, t = input_ids.shape
        r = self.residual(Rows.training(input_ids))
        return self.logits(r).reshape(b, t, -1), r.reshape(b, t, -1)

    def mtp_forward_train(
        self, residual: torch.Tensor, next_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """residual [B, T, hc*H], next_ids [B, T] (cell i: x_{i+1}) -> (logits, residual out)."""
        b, t = next_ids.shape
        logits, out = self.mtp_cells(
            residual.reshape(b * t, -1), next_ids.reshape(-1), Rows.training(next_ids)
        )
        return logits.reshape(b, t, -1), out.reshape(b, t, -1)


def commit(model: FlashNext, piece: Piece, kept: int) -> None:
    """Keep the first `kept` rows of a piece in its session; roll back the rest.

    Attention caches only move their length; the GDN recurrent state takes the state after
    row kept-1 (a chunked piece must keep all its rows); conv windows and the PLE tail and
    ids slice their input history at the kept length.
    """
    commit_all(model, [(piece, kept)])


def commit_all(model: FlashNext, kept: list[tuple[Piece, int]]) -> None:
    """commit() for several pieces of a round, with every state copy of every piece and
    layer made in one multi-tensor copy (a round of 16 streams over 10 stateful layers made
    some 320 small copies, one launch each)."""
    dsts: list[torch.Tensor] = []
    srcs: list[torch.Tensor] = []
    for piece, n in kept:
        if not 0 <= n <= piece.length:
            raise ValueError(f"cannot keep {n} of {piece.length} rows")
        for (kind, _), (_, states) in piece.pending.items():
            whole = kind == "replayed" or (kind == "gdn" and states.shape[0] != piece.length)
            if whole and n != piece.length:  # no state per row to roll back to
                raise ValueError("a chunked or replayed prompt piece keeps all of its rows")
    for piece, n in kept:
        if n == 0:
            continue
        s = piece.session
        for (kind, idx), (xfull, states) in piece.pending.items():
            if kind == "replayed":  # its state is in the session already (runner/fresh.py)
                continue
            if kind == "gdn":
                g = s.gdn[idx]
                last = states[n - 1] if states.shape[0] == piece.length else states[-1]
                dsts += [g.recurrent, g.conv]
                srcs += [last, xfull[n : n + g.conv.shape[0]]]
            else:
                p = s.ple[idx]
                dsts += [p.conv, p.ids]
                srcs += [xfull[n : n + p.conv.shape[0]], states[n : n + p.ids.shape[0]]]
        s.length = piece.start + n
        piece.pending.clear()
    copy_all(dsts, srcs)


@torch.no_grad()
def run_piece(
    model: FlashNext,
    session: SessionState,
    tokens: torch.Tensor,
    start: int,
    recurrent: bool,
    whole: bool = False,
) -> torch.Tensor:
    """One piece through the model, committed whole: logits [T, V] fp32 for its rows.
    whole: the piece is its whole prompt (rows.Piece.whole)."""
    device = model.embed_tokens.weight.device
    rows = Rows.of([(session, tokens, start, recurrent, whole)], device)
    r = model.residual(rows)
    commit(model, rows.pieces[0], rows.pieces[0].length)
    session.last_residual = r[-1]
    return model.logits(r)
