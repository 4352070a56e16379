"""Sparse MoE block: routed SwiGLU experts (stacked weights) plus a gated shared expert."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashlane.kernels import Kernels
from flashlane.kernels.linear.fp8 import Fp8Weight, cat_stack
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


class WithShared(Stacked):
    """The router and the shared expert's gate as one [E+1, H] weight, and the shared expert
    as expert E of the experts' stacks ([E+1, I, H] gate and up, [E+1, H, I] down), so that
    one set of grouped launches serves both (kernels.moe_shared). As Stacked: after
    `stack()` the checkpoint's tensors are views of these; if they were moved since,
    `stacked` gives None and the layer runs the shared expert on its own."""

    def __init__(self, moe: SparseMoe):
        super().__init__(moe.gate, moe.shared_expert_gate)
        self.moe = moe
        self.experts: tuple[torch.Tensor | Fp8Weight, ...] = ()

    def stack(self) -> None:
        if self.moe.placed is not None:
            return  # expert parallel: the rank's experts are not the router's E
        if self.moe.cfg.shared_expert_intermediate_size != self.moe.cfg.moe_intermediate_size:
            return  # the shared expert is not an expert's shape: it runs on its own
        e, se = self.moe.experts, self.moe.shared_expert
        pairs = [
            (e.gate_proj, se.gate_proj.weight),
            (e.up_proj, se.up_proj.weight),
            (e.down_proj, se.down_proj.weight),
        ]
        kinds = {isinstance(w, Fp8Weight) for pair in pairs for w in pair}
        if len(kinds) > 1:
            return  # FP8 experts beside a plain shared expert (or back): it runs on its own
        super().stack()
        stacks = []
        for p, w in pairs:
            if isinstance(p, Fp8Weight):
                s = cat_stack(p, w)
                p.q.data, w.q.data = s.q[:-1], s.q[-1]
                p.scale_inv.data, w.scale_inv.data = s.scale_inv[:-1], s.scale_inv[-1]
            else:
                s = torch.cat([p.detach(), w.detach()[None]])
                p.data, w.data = s[:-1], s[-1]
            stacks.append(s)
        self.experts = tuple(stacks)

    def stacked(self, x: torch.Tensor) -> torch.Tensor | None:
        w = super().stacked(x)
        e = self.moe.experts
        if (
            w is None
            or not self.experts
            or any(
                s.data_ptr() != p.data_ptr()
                for s, p in zip(self.experts, (e.gate_proj, e.up_proj, e.down_proj))
            )
        ):
            return None
        return w


class SparseMoe(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.gate = linear(h, cfg.num_experts)
        self.experts = Experts(cfg.num_experts, h, cfg.moe_intermediate_size)
        self.shared_expert = MLP(h, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = linear(h, 1)
        self.with_shared = WithShared(self)
        # On a tensor-parallel rank each expert holds a slice of its width, so the block's
        # output is a part; parallel/plan.py sets `combine` to the sum over ranks. On an
        # expert-parallel rank the stacks hold experts placed, placed + 1, ... whole, and
        # `reduce_slots` sums the ranks' slot outputs (kernels.moe_placed).
        self.combine = None
        self.placed: int | None = None
        self.reduce_slots = None

    def forward(self, x: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        """x: [N, H] -> [N, H] (parts summed over the ranks under tensor parallel)."""
        out = self.experts_out(x, kernels)
        return out if self.combine is None else self.combine(out)

    def experts_out(self, x: torch.Tensor, kernels: Kernels) -> torch.Tensor:
        """x: [N, H] -> [N, H]: the routed experts, plus the shared expert gated by its
        logit: as one more expert of the routed experts' launches once the weights are
        stacked (WithShared), else on its own and added in their last launch."""
        cfg, e = self.cfg, self.experts
        router = self.with_shared.stacked(x)  # None on an expert-parallel rank (unstacked)
        if router is not None:
            return kernels.moe_shared(
                x, router, *self.with_shared.experts, cfg.num_experts_per_tok, cfg.norm_topk_prob
            )
        se = self.shared_expert
        shared = (
            self.shared_expert_gate(x),
            se.down_proj(kernels.swiglu(se.gate_proj(x), se.up_proj(x))),
        )
        stacks, k = (e.gate_proj, e.up_proj, e.down_proj), cfg.num_experts_per_tok
        if self.placed is not None:
            return kernels.moe_placed(
                x, self.gate.weight, *stacks, k, cfg.norm_topk_prob, self.placed,
                self.reduce_slots, shared,
            )  # fmt: skip
        return kernels.moe(
            x, self.gate.weight, *stacks, k, cfg.norm_topk_prob, shared,
        )  # fmt: skip
