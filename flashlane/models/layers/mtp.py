"""The MTP head (weights `mtp.*`; no HF reference exists, this is ours from REFERENCE.md).

Cell i pairs the target's pre-mixer residual R_i with the embedding of x_{i+1}, at rope
position i, and predicts x_{i+2}:
    e = fc_embedding(norm_e(embed(x_{i+1})));  hn = norm_h(R_i)   (one norm over all hc*H)
    x_c = fc_hidden(hn_c) + e for every stream c
then one QSA attention + MoE decoder layer (its own hyper-connections and KV/indexer cache),
then the head's own hyper_connection_mixer and the shared lm_head. A chained draft feeds the
cell's output residual back in as the next R.
"""

from __future__ import annotations

import torch
from torch import nn

from flashlane.kernels import Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.layers.decoder import DecoderLayer
from flashlane.models.layers.hyper_connection import HyperConnection
from flashlane.models.layers.norms import RMSNorm, linear
from flashlane.models.layers.rotary import Rotary
from flashlane.models.rows import Rows


class MtpHead(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.pre_fc_norm_embedding = RMSNorm(h, cfg.rms_eps)
        self.pre_fc_norm_hidden = RMSNorm(cfg.hc_count * h, cfg.rms_eps)
        self.fc_embedding = linear(h, h)
        self.fc_hidden = linear(h, h)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, -1 - j, "sparse", cache_of=lambda s, j=j: s.mtp[j])
            for j in range(cfg.num_mtp_layers)
        )
        self.hyper_connection_mixer = HyperConnection(
            h, cfg.hc_count, cfg.hc_lowrank, cfg.rms_eps, inject=False
        )

    def forward(
        self,
        residual: torch.Tensor,
        next_embed: torch.Tensor,
        rows: Rows,
        rotary: Rotary,
        kernels: Kernels,
        graphs=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """residual: R_i [N, hc*H]; next_embed: embed(x_{i+1}) [N, H]; rows at cell positions.
        With `graphs` (runner.graphs.Graphs) the layer's row-count-only parts replay, as the
        target's do.

        Returns (hidden for the lm_head [N, H], the cell's output residual [N, hc*H]).
        """
        cfg = self.cfg
        e = self.fc_embedding(self.pre_fc_norm_embedding(next_embed))
        hn = self.pre_fc_norm_hidden(residual).unflatten(-1, (cfg.hc_count, cfg.hidden_size))
        r = (self.fc_hidden(hn) + e.unsqueeze(-2)).flatten(-2)
        for layer in self.layers:
            r = layer(r, rows, rotary, kernels, graphs)
        return self.hyper_connection_mixer.read(r)[0], r
