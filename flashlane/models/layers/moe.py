"""Sparse MoE block: routed SwiGLU experts (stacked weights) plus a gated shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashlane.kernels import Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.norms import Stacked, linear


class Experts(nn.Module):
    """Checkpoint `experts.E.{gate,up,down}_proj.weight`, stacked by the loader."""

    def __init__(self, num: int, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.zeros(num, inner, hidden))
        self.up_proj = nn.Parameter(torch.zeros(num, inner, hidden))
        self.down_proj = nn.Parameter(torch.zeros(num, hidden, inner))


class MLP(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = linear(hidden, inner)
        self.up_proj = linear(hidden, inner)
        self.down_proj = linear(inner, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.gate = linear(h, cfg.num_experts)
        self.experts = Experts(cfg.num_experts, h, cfg.moe_intermediate_size)
        self.shared_expert = MLP(h, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = linear(h, 1)
        se = self.shared_expert
        self.shared_in = Stacked(se.gate_proj, se.up_proj, self.shared_expert_gate)

    def forward(self, x: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        """x: [N, H] -> [N, H]: the routed experts, plus the shared expert gated by its
        logit (added in the routed experts' last launch)."""
        gate, up, shared_gate = self.shared_in(x)
        shared = self.shared_expert.down_proj(kernels.swiglu(gate, up))
        e = self.experts
        return kernels.moe(
            x, self.gate.weight, e.gate_proj, e.up_proj, e.down_proj,
            self.cfg.num_experts_per_tok, self.cfg.norm_topk_prob, (shared_gate, shared),
        )  # fmt: skip
