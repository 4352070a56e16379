"""Gated DeltaNet layer (linear attention) with explicit per-stream state."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashlane.kernels import Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.norms import GatedRMSNorm, linear
from flashlane.models.rows import Rows


class ConvWeight(nn.Module):
    def __init__(self, channels: int, kernel: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel))


class GatedDeltaNet(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        h, hv = cfg.hidden_size, cfg.linear_num_v_heads
        self.in_proj_qkv = linear(h, cfg.linear_conv_dim)
        self.in_proj_z = linear(h, cfg.linear_value_dim)
        self.in_proj_b = linear(h, hv)
        self.in_proj_a = linear(h, hv)
        self.A_log = nn.Parameter(torch.zeros(hv))
        self.dt_bias = nn.Parameter(torch.ones(hv))
        self.conv1d = ConvWeight(cfg.linear_conv_dim, cfg.linear_conv_kernel)
        self.norm = GatedRMSNorm(cfg.linear_v_head_dim, cfg.rms_eps, cfg.output_gate)
        self.out_proj = linear(cfg.linear_value_dim, h)

    def forward(self, x: torch.Tensor, rows: Rows, kernels: Kernels) -> torch.Tensor:
        """x: [N, H] -> [N, H]; records per piece ("gdn", idx): (conv inputs, states)."""
        qkv, g, beta, z = self.project(x)
        return self.finish(self.mix(qkv, g, beta, rows, kernels), z)

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The row-wise input projections: (qkv, log decay g, beta, output gate z)."""
        beta = torch.sigmoid(self.in_proj_b(x))
        dt = torch.promote_types(x.dtype, torch.float32)
        g = -self.A_log.to(dt).exp() * F.softplus(self.in_proj_a(x).to(dt) + self.dt_bias.to(dt))
        return self.in_proj_qkv(x), g, beta, self.in_proj_z(x)

    def mix(self, qkv, g, beta, rows: Rows, kernels: Kernels) -> torch.Tensor:
        """Conv and the gated delta rule over each piece's session state -> o [N, HV, Dv]."""
        cfg, n = self.cfg, qkv.shape[0]
        # verify windows of equal width run stacked: one recurrent call for all of them
        parts = zip(
            rows.split(qkv, True), rows.split(g, True), rows.split(beta, True), rows.groups(True)
        )
        outs = [self._mix(qkv, g_p, b_p, group, kernels) for qkv, g_p, b_p, group in parts]
        return rows.join(outs, True).reshape(n, cfg.linear_num_v_heads, cfg.linear_v_head_dim)

    def finish(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """The gated output norm and the output projection -> [N, H]."""
        n = o.shape[0]
        return self.out_proj(self.norm(o, z.reshape(o.shape)).reshape(n, -1))

    def _mix(self, qkv, g, beta, group, kernels: Kernels) -> torch.Tensor:
        cfg, key = self.cfg, ("gdn", self.layer_idx)
        b, t, _ = qkv.shape
        sessions = [p.session for p in group]
        if sessions[0] is None:
            window = qkv.new_zeros(b, cfg.linear_conv_kernel - 1, qkv.shape[-1])
            state = None
        else:
            window = torch.stack([s.gdn[self.layer_idx].conv for s in sessions])
            state = torch.stack([s.gdn[self.layer_idx].recurrent for s in sessions])
        y, xfull = kernels.causal_conv(qkv, window, self.conv1d.weight[:, 0, :])
        kd, vd = cfg.linear_key_dim, cfg.linear_value_dim
        q = y[..., :kd].reshape(b, t, cfg.linear_num_k_heads, -1)
        k = y[..., kd : 2 * kd].reshape(b, t, cfg.linear_num_k_heads, -1)
        v = y[..., 2 * kd : 2 * kd + vd].reshape(b, t, cfg.linear_num_v_heads, -1)
        rep = cfg.linear_num_v_heads // cfg.linear_num_k_heads
        q = (kernels.l2norm(q) * cfg.linear_k_head_dim**-0.5).repeat_interleave(rep, dim=2)
        k = kernels.l2norm(k).repeat_interleave(rep, dim=2)
        if group[0].recurrent:
            o, states = kernels.recurrent_gdn(q, k, v, g, beta, state)
        else:
            o, final = kernels.chunk_gdn(q, k, v, g, beta, state)
            states = final.unsqueeze(1)
        if sessions[0] is not None:
            # padding rows (zero beta, zero decay) leave the state as is; they are cut here
            for i, piece in enumerate(group):
                n = piece.length
                rows_of = states[i, :n] if piece.recurrent else states[i]
                piece.pending[key] = (xfull[i, : xfull.shape[1] - t + n], rows_of)
        return o
