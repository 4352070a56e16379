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
        (runner.graphs.Graphs), the parts that depend on the row count alone replay."""
        if self.ple is not None:
            r = r + self.ple(r, rows, kernels)
        if graphs is not None:
            return self._graphed(r, rows, rotary, kernels, graphs)
        a, w = self.attn_hyper_connection.read(r)
        if self.kind == "linear":
            y = self.linear_attn(a, rows, kernels)
        else:
            y = self.self_attn(a, rows, rotary, kernels)
        return self.mlp_half(r, y, w, kernels)

    def _graphed(self, r, rows: Rows, rotary: Rotary, kernels: Kernels, graphs) -> torch.Tensor:
        """The same block with everything but the mixer's use of session state replayed."""
        parts = self.graph_parts(kernels)
        if self.kind != "linear":
            a, w = graphs.run((id(self), "read"), parts["read"], r)
            y = self.self_attn(a, rows, rotary, kernels)
            return graphs.run((id(self), "mlp"), parts["mlp"], r, y, w)[0]
        w, qkv, g, beta, z = graphs.run((id(self), "read"), parts["read"], r)
        o = self.linear_attn.mix(qkv, g, beta, rows, kernels)
        return graphs.run((id(self), "mlp"), parts["mlp"], r, o, z, w)[0]

    def graph_parts(self, kernels: Kernels) -> dict:
        """The block's row-count-only parts, as functions of tensors to tuples of tensors:
        "read" (r -> hyper-connection read, and for a GDN layer its input projections) and
        "mlp" (the mixer's output -> the residual after the block)."""
        if self.kind != "linear":
            return {
                "read": self.attn_hyper_connection.read,
                "mlp": lambda r, y, w: (self.mlp_half(r, y, w, kernels),),
            }
        gdn = self.linear_attn

        def read(r):
            a, w = self.attn_hyper_connection.read(r)
            return (w, *gdn.project(a))

        def mlp(r, o, z, w):
            return (self.mlp_half(r, gdn.finish(o, z), w, kernels),)

        return {"read": read, "mlp": mlp}

    def mlp_half(self, r, y, w, kernels: Kernels) -> torch.Tensor:
        """The mixer's output written to the streams, then the MLP block behind its own
        hyper-connection."""
        r = HyperConnection.write(r, y, w)
        a, w = self.mlp_hyper_connection.read(r)
        return HyperConnection.write(r, self.mlp(a, kernels), w)
