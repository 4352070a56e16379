"""One decoder block: optional PLE, then mixer (GDN or QSA) and MoE, each behind a
hyper-connection."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from flashlane.kernels import Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.gated_deltanet import GatedDeltaNet
from flashlane.models.layers.hyper_connection import HyperConnection
from flashlane.models.layers.moe import SparseMoe
from flashlane.models.layers.ple import PLELayer
from flashlane.models.layers.qsa_attention import QSAttention
from flashlane.models.layers.rotary import Rotary
from flashlane.models.rows import Rows
from flashlane.models.state import AttnCache, SessionState


class DecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        kind: str,
        cache_of: Callable[[SessionState], AttnCache] | None = None,
    ):
        super().__init__()
        self.kind = kind
        if layer_idx in cfg.ple_layer_ids and cache_of is None:
            self.ple = PLELayer(cfg, layer_idx, cfg.ple_layer_ids.index(layer_idx))
        else:
            self.ple = None
        hc = (cfg.hidden_size, cfg.hc_count, cfg.hc_lowrank, cfg.rms_eps)
        self.attn_hyper_connection = HyperConnection(*hc)
        if kind == "linear":
            self.linear_attn = GatedDeltaNet(cfg, layer_idx)
        else:
            self.self_attn = QSAttention(cfg, cache_of or (lambda s: s.attn[layer_idx]))
        self.mlp_hyper_connection = HyperConnection(*hc)
        self.mlp = SparseMoe(cfg)

    def forward(
        self, r: torch.Tensor, rows: Rows, rotary: Rotary, kernels: Kernels, graphs=None
    ) -> torch.Tensor:
        """r: the residual [N, hc*H] -> the residual after this block. With `graphs`
        (runner.graphs.Graphs), the parts that depend on the row count alone replay: the
        runner composes them (runner/graphed_blocks.py)."""
        if graphs is not None:
            return graphs.block(self, r, rows, rotary, kernels)
        if self.ple is not None:
            r = r + self.ple(r, rows, kernels)
        a, w = self.attn_hyper_connection.read(r)
        if self.kind == "linear":
            y = self.linear_attn(a, rows, kernels)
        else:
            y = self.self_attn(a, rows, rotary, kernels)
        return self.mlp_half(r, y, w, kernels)

    def mlp_half(self, r, y, w, kernels: Kernels, then: HyperConnection | None = None, rows=None):
        """The mixer's output written to the streams, then the MLP block behind its own
        hyper-connection. With `then` (the hyper-connection that reads the result next),
        (the residual, then's norm of it) from one launch (the same bits as its read's);
        rows [B]: then's norm of those rows alone (HyperConnection.write_norm)."""
        r, xn = self.attn_hyper_connection.write_norm(r, y, w, self.mlp_hyper_connection)
        hc = self.mlp_hyper_connection
        a, w = hc.read(r, xn)
        if then is None:
            return hc.write(r, self.mlp(a, kernels), w)
        return hc.write_norm(r, self.mlp(a, kernels), w, then, rows)
