"""A sibling's decoder block (Qwen3-Next, Qwen3.5): a plain pre-norm residual.

h = h + mixer(input_layernorm(h)), then h = h + mlp(post_attention_layernorm(h)); the mixer is
Gated DeltaNet or gated full attention, the MLP the routed MoE with its gated shared expert or
a dense SwiGLU MLP. Both norms are zero-centred (1 + w). With `graphs` the parts that depend
on the row count alone replay, as Flash Next's block's do (decoder.py): "read" (the norm and
the mixer's projections), "mlp" (the mixer's output onward) and, for verify windows of one
width, the GDN's "conv".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from flashlane.kernels import Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.gated_attention import GatedAttention
from flashlane.models.layers.gated_deltanet import GatedDeltaNet
from flashlane.models.layers.moe import SparseMoe
from flashlane.models.layers.norms import RMSNorm, Stacked, linear
from flashlane.models.rows import Rows
from flashlane.models.state import AttnCache, SessionState


class DenseMlp(nn.Module):
    """The dense SwiGLU MLP: down(silu(gate x) * up x), gate and up as one product."""

    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = linear(hidden, inner)
        self.up_proj = linear(hidden, inner)
        self.down_proj = linear(inner, hidden)
        self.gate_up = Stacked(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        return self.down_proj(kernels.swiglu(*self.gate_up(x)))


class PlainDecoderLayer(nn.Module):
    def __init__(
        self,
        cfg: ModelConfig,
        layer_idx: int,
        kind: str,
        cache_of: Callable[[SessionState], AttnCache] | None = None,
    ):
        super().__init__()
        self.kind = kind
        self.ple = None  # Flash Next's block's field: a sibling has no PLE
        self._parts: tuple[Kernels, dict] | None = None  # graph_parts, for the kernels in use
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        if kind == "linear":
            self.linear_attn = GatedDeltaNet(cfg, layer_idx)
        else:
            self.self_attn = GatedAttention(cfg, cache_of or (lambda s: s.attn[layer_idx]))
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        if cfg.is_moe_layer(layer_idx):
            self.mlp = SparseMoe(cfg)
        else:
            self.mlp = DenseMlp(cfg.hidden_size, cfg.intermediate_size)

    def forward(
        self, h: torch.Tensor, rows: Rows, rotary, kernels: Kernels, graphs=None
    ) -> torch.Tensor:
        """h: the residual [N, H] -> the residual after this block. With `graphs`
        (runner.graphs.Graphs), the parts that depend on the row count alone replay."""
        if graphs is not None:
            return self._graphed(h, rows, rotary, kernels, graphs)
        a = self.input_layernorm(h)
        if self.kind == "linear":
            h = h + self.linear_attn(a, rows, kernels)
        else:
            h = h + self.self_attn(a, rows, rotary, kernels)
        return self.mlp_half(h, kernels)

    def mlp_half(self, h: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        """The MLP behind its norm, added to the residual."""
        return h + self.mlp(self.post_attention_layernorm(h), kernels)

    def _graphed(self, h, rows: Rows, rotary, kernels: Kernels, graphs) -> torch.Tensor:
        """The same block with everything but the mixer's use of session state replayed;
        B verify windows of one width T (rows.one_width) also replay the GDN conv."""
        parts, key = self.graph_parts(kernels), id(self)
        if self.kind != "linear":
            cos, sin = rows.cos_sin(rotary, h.dtype)
            q, gate, k, v = graphs.run((key, "read"), parts["read"], h, cos, sin, views=4)
            o = self.self_attn.attend(q, k, v, rows, kernels)
            return graphs.run((key, "mlp"), parts["mlp"], h, o, gate)[0]
        gdn, t = self.linear_attn, rows.one_width()
        if t is None:
            qkv, a, b, z = graphs.run((key, "read"), parts["read"], h, views=4)
            return graphs.run((key, "mlp"), parts["mlp"], h, gdn.mix(qkv, a, b, rows, kernels), z)[
                0
            ]
        n = len(rows.pieces)
        window, state = gdn.state_of([p.session for p in rows.pieces])
        z, a, b, q, k, v, xfull = graphs.run(
            (key, "conv"), parts["conv"], h.view(n, t, -1), window, views=6
        )
        o, states = kernels.recurrent_gdn(q, k, v, None, None, state, gates=gdn.gates(a, b))
        gdn.record(rows.pieces, xfull, states)
        return graphs.run((key, "mlp"), parts["mlp"], h, o.flatten(0, 1), z.flatten(0, 1))[0]

    def graph_parts(self, kernels: Kernels) -> dict:
        """The parts (below) for these kernels, made once."""
        if self._parts is None or self._parts[0] is not kernels:
            self._parts = (kernels, self._make_parts(kernels))
        return self._parts[1]

    def _make_parts(self, kernels: Kernels) -> dict:
        """The block's row-count-only parts, as functions of tensors to tuples of tensors.
        Attention: "read" (h, cos, sin -> q, gate, k, v) and "mlp" (h, o, gate -> the
        residual after the block). GDN: "read" (h -> qkv, the gates' inputs a and b, output
        gate z), "conv" (B windows of T rows [B, T, H] and their conv windows -> per [B, T]: z,
        a, b, q, k, v after the conv and norms; and the conv inputs) and "mlp" (h, o, z -> the
        residual)."""
        if self.kind != "linear":
            attn = self.self_attn

            def read_attn(h, cos, sin):
                return attn.project(self.input_layernorm(h), cos, sin)

            def mlp_attn(h, o, gate):
                return (self.mlp_half(h + attn.output(o, gate), kernels),)

            return {"read": read_attn, "mlp": mlp_attn}
        gdn = self.linear_attn

        def read(h):
            return gdn.project(self.input_layernorm(h))

        def conv(h3, window):
            b, t = h3.shape[:2]
            qkv, a, bb, z = (x.unflatten(0, (b, t)) for x in read(h3.flatten(0, 1)))
            q, k, v, xfull = gdn.conv_qkv(qkv, window, kernels)
            return z, a, bb, q, k, v, xfull

        def mlp(h, o, z):
            return (self.mlp_half(h + gdn.finish(o, z), kernels),)

        return {"read": read, "conv": conv, "mlp": mlp}
