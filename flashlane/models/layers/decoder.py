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
        self._parts: tuple[Kernels, dict] | None = None  # graph_parts, for the kernels in use

    def forward(
        self, r: torch.Tensor, rows: Rows, rotary: Rotary, kernels: Kernels, graphs=None
    ) -> torch.Tensor:
        """r: the residual [N, hc*H] -> the residual after this block. With `graphs`
        (runner.graphs.Graphs), the parts that depend on the row count alone replay."""
        if graphs is not None:
            return self._graphed(r, rows, rotary, kernels, graphs)
        if self.ple is not None:
            r = r + self.ple(r, rows, kernels)
        a, w = self.attn_hyper_connection.read(r)
        if self.kind == "linear":
            y = self.linear_attn(a, rows, kernels)
        else:
            y = self.self_attn(a, rows, rotary, kernels)
        return self.mlp_half(r, y, w, kernels)

    def _graphed(self, r, rows: Rows, rotary: Rotary, kernels: Kernels, graphs) -> torch.Tensor:
        """The same block with everything but the mixer's use of session state replayed.
        When the rows are B verify windows of one width T (rows.one_width), the PLE and the
        GDN conv run in the graphs too, on [B, T] inputs with the sessions' windows."""
        parts, t = self.graph_parts(kernels), rows.one_width()
        if self.ple is not None and t is not None:
            b, pieces = len(rows.pieces), rows.pieces
            hist = self.ple._history(pieces, rows.token_ids.view(b, t))
            window = self.ple.window_of(pieces)
            r3, xfull = graphs.run((id(self), "ple"), parts["ple"], r.view(b, t, -1), hist, window)
            self.ple.record(pieces, xfull, hist)
            r = r3.flatten(0, 1)
        elif self.ple is not None:
            r = r + self.ple(r, rows, kernels)
        if self.kind != "linear":
            cos, sin = rows.cos_sin(rotary, r.dtype)
            w, q, gate, k, v, iq, raw = graphs.run(
                (id(self), "read"), parts["read"], r, cos, sin, views=7
            )
            o = self.self_attn.attend(q, k, v, iq, raw, rows, rotary, kernels)
            return graphs.run((id(self), "mlp"), parts["mlp"], r, o, gate, w)[0]
        gdn = self.linear_attn
        if t is None:
            w, qkv, gate_a, gate_b, z = graphs.run((id(self), "read"), parts["read"], r, views=5)
            o = gdn.mix(qkv, gate_a, gate_b, rows, kernels)
            return graphs.run((id(self), "mlp"), parts["mlp"], r, o, z, w)[0]
        b = len(rows.pieces)
        window, state = gdn.state_of([p.session for p in rows.pieces])
        w, z, gate_a, gate_b, q, k, v, xfull = graphs.run(
            (id(self), "conv"), parts["conv"], r.view(b, t, -1), window, views=7
        )
        gates = gdn.gates(gate_a, gate_b)  # computed in the rule's programs
        o, states = kernels.recurrent_gdn(q, k, v, None, None, state, gates=gates)
        gdn.record(rows.pieces, xfull, states)
        flat = (x.flatten(0, 1) for x in (o, z, w))
        return graphs.run((id(self), "mlp"), parts["mlp"], r, *flat)[0]

    def graph_parts(self, kernels: Kernels) -> dict:
        """The parts (below) for these kernels, made once: a replay never calls them, so
        building them every forward was work for nothing."""
        if self._parts is None or self._parts[0] is not kernels:
            self._parts = (kernels, self._make_parts(kernels))
        return self._parts[1]

    def _make_parts(self, kernels: Kernels) -> dict:
        """The block's row-count-only parts, as functions of tensors to tuples of tensors.
        Attention: "read" (r, cos, sin -> write weights and the attention's row-wise
        projections) and "mlp" (the attention's output -> the residual after the block).
        GDN: "read" (r -> write weights and the input projections), "conv" (B windows of T
        rows [B, T, hc*H] and their conv windows -> per [B, T]: write weights, output gate,
        the gates' inputs a and b, q, k, v after the conv and norms; and the conv inputs) and
        "mlp" (the mixer's output -> the residual).
        "ple" (a PLE layer; B windows of T rows): r3, ids, conv window -> r3 + PLE, conv inputs."""
        out = {}
        if self.ple is not None:

            def ple(r3, history, window):
                add, xfull = self.ple.stacked(r3, history, window, kernels)
                return r3 + add, xfull

            out["ple"] = ple
        if self.kind != "linear":
            attn = self.self_attn

            def read_attn(r, cos, sin):
                a, w = self.attn_hyper_connection.read(r)
                return (w, *attn.project(a, cos, sin))

            def mlp_attn(r, o, gate, w):
                return (self.mlp_half(r, attn.output(o, gate), w, kernels),)

            return {**out, "read": read_attn, "mlp": mlp_attn}
        gdn = self.linear_attn

        def read(r):
            a, w = self.attn_hyper_connection.read(r)
            return (w, *gdn.project(a))

        def conv(r3, window):
            b, t = r3.shape[:2]
            w, qkv, gate_a, gate_b, z = (x.unflatten(0, (b, t)) for x in read(r3.flatten(0, 1)))
            q, k, v, xfull = gdn.conv_qkv(qkv, window, kernels)
            return w, z, gate_a, gate_b, q, k, v, xfull

        def mlp(r, o, z, w):
            return (self.mlp_half(r, gdn.finish(o, z), w, kernels),)

        return {**out, "read": read, "conv": conv, "mlp": mlp}

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
