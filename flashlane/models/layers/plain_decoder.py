"""A sibling's decoder block (Qwen3-Next, Qwen3.5): a plain pre-norm residual.

h = h + mixer(input_layernorm(h)), then h = h + mlp(post_attention_layernorm(h)); the mixer is
Gated DeltaNet or gated full attention, the MLP the routed MoE with its gated shared expert or
a dense SwiGLU MLP. Both norms are zero-centred (1 + w). With `graphs` the parts that depend
on the row count alone replay, as Flash Next's block's do (runner/graphed_blocks.py).
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
        (runner.graphs.Graphs), the parts that depend on the row count alone replay: the
        runner composes them (runner/graphed_blocks.py)."""
        if graphs is not None:
            return graphs.block(self, h, rows, rotary, kernels)
        a = self.input_layernorm(h)
        if self.kind == "linear":
            h = h + self.linear_attn(a, rows, kernels)
        else:
            h = h + self.self_attn(a, rows, rotary, kernels)
        return self.mlp_half(h, kernels)

    def mlp_half(self, h: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        """The MLP behind its norm, added to the residual."""
        return h + self.mlp(self.post_attention_layernorm(h), kernels)
