"""Qwen3-Next and Qwen3.5 (dense and MoE), the text part: embeddings -> plain pre-norm decoder
blocks -> final norm -> lm_head, with the MTP head (`mtp.*`) that transformers drops.

The runner sees the same surface as FlashNext's (residual, logits, head_logits, mtp,
use_kernels): here a row's "residual" is the final norm's output, the lm_head's input, which
is also the hidden state the MTP head reads (vLLM qwen3_next_mtp.py / qwen3_5_mtp.py: the
drafter is given the hidden states that compute_logits reads). The sessions, kernels, commit
and lane core are Flash Next's.
"""

from __future__ import annotations

import torch
from torch import nn

from flashlane.kernels import REFERENCE, Kernels
from flashlane.models.config import ModelConfig
from flashlane.models.flashnext import FlashNext
from flashlane.models.layers.norms import RMSNorm, linear
from flashlane.models.layers.plain_decoder import PlainDecoderLayer
from flashlane.models.layers.rotary import Rotary
from flashlane.models.rows import Rows


class Qwen3MtpHead(nn.Module):
    """Cell i: x = fc([pre_fc_norm_embedding(embed(x_{i+1})), pre_fc_norm_hidden(h_i)]), one
    gated-attention decoder block (its own KV cache, the family's MLP), then `norm`: the
    lm_head's input, which is also what a chained cell reads as its h. (With several MTP
    layers they run in order, as Flash Next's head runs them; published checkpoints have one.)"""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        h = cfg.hidden_size
        self.pre_fc_norm_embedding = RMSNorm(h, cfg.rms_eps)
        self.pre_fc_norm_hidden = RMSNorm(h, cfg.rms_eps)
        self.fc = linear(2 * h, h)
        self.layers = nn.ModuleList(
            PlainDecoderLayer(cfg, -1, "full", cache_of=lambda s, j=j: s.mtp[j])
            for j in range(cfg.num_mtp_layers)
        )
        self.norm = RMSNorm(h, cfg.rms_eps)

    def forward(
        self,
        hidden: torch.Tensor,
        next_embed: torch.Tensor,
        rows: Rows,
        rotary: Rotary,
        kernels: Kernels,
        graphs=None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden: h_i [N, H]; next_embed: embed(x_{i+1}) [N, H]; rows at cell positions ->
        (the lm_head's input [N, H], the cell's output [N, H]: the same tensor)."""
        e = self.pre_fc_norm_embedding(next_embed)
        x = self.fc(torch.cat([e, self.pre_fc_norm_hidden(hidden)], dim=-1))
        for layer in self.layers:
            x = layer(x, rows, rotary, kernels, graphs)
        x = self.norm(x)
        return x, x


class Qwen3Hybrid(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.embed_tokens = nn.Embedding(cfg.vocab_size, h)
        self.layers = nn.ModuleList(
            PlainDecoderLayer(cfg, i, kind) for i, kind in enumerate(cfg.layer_types)
        )
        self.norm = RMSNorm(h, cfg.rms_eps)
        self.lm_head = linear(h, cfg.vocab_size)
        self.mtp = Qwen3MtpHead(cfg) if cfg.num_mtp_layers else None
        self.rotary = Rotary(cfg.rotary_dim, cfg.rope_theta)
        self.kernels: Kernels = REFERENCE
        self.graphs = None  # runner.graphs.Graphs on CUDA: replays of the row-count-only parts

    # the same pointing of every op at the kernels, and stacking of shared-input linears
    use_kernels = FlashNext.use_kernels

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def residual(self, rows: Rows) -> torch.Tensor:
        """All rows through every block -> the final norm's output [N, H]."""
        h = self.embed_tokens(rows.token_ids)
        for layer in self.layers:
            h = layer(h, rows, self.rotary, self.kernels, self.graphs)
        return self.norm(h)

    def logits(self, r: torch.Tensor) -> torch.Tensor:
        """Rows of the final norm's output [M, H] -> fp32 logits [M, V]."""
        return self.head_logits(r).float()

    def head_logits(self, r: torch.Tensor, xn: torch.Tensor | None = None) -> torch.Tensor:
        """The lm_head's logits [M, V] in the model's dtype (xn: FlashNext's, unused)."""
        return self.lm_head(r)

    # a sibling's residual is one stream (hc 1): FlashNext's MTP cells and training passes
    mtp_cells = FlashNext.mtp_cells
    forward_train = FlashNext.forward_train
    mtp_forward_train = FlashNext.mtp_forward_train
