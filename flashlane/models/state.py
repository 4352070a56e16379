"""One stream's isolated state (a session), allocated once for a context capacity.

Per attention layer (and per MTP layer): K, V, raw indexer keys and pooled block keys
for `capacity` positions (a sibling's gated full attention has no indexer: its key buffers
are zero wide); per GDN layer: the conv window (last k-1 inputs) and the recurrent
state; per PLE layer: the dilated-conv tail and the last n-1 token ids. Attention buffers
are valid up to `length` (MTP: `mtp_length`): rolling back is lowering the length.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flashlane.kernels.session_tables import (
    GDN_CONV_COLUMN,
    PLE_IDS_COLUMN,
    TABLE_COLUMNS,
    TABLE_WIDTH,
    attn_table,
    gdn_table,
    offsets_table,
    ple_table,
)
from flashlane.models.config import ModelConfig

# the session tables' layout and builders live with the kernels that read them; runner/ and
# the tests name them here, beside the records they are built from
__all__ = [
    "GDN_CONV_COLUMN",
    "PLE_IDS_COLUMN",
    "TABLE_COLUMNS",
    "TABLE_WIDTH",
    "AttnCache",
    "GdnState",
    "PleState",
    "SessionState",
    "attn_table",
    "gdn_table",
    "offsets_table",
    "ple_table",
]


@dataclass(slots=True)
class AttnCache:
    k: torch.Tensor  # [capacity, Hkv, D], normed and roped
    v: torch.Tensor  # [capacity, Hkv, D]
    index_keys: torch.Tensor  # [capacity, Di] raw indexer keys
    block_keys: torch.Tensor  # [capacity // block, Di] pooled, normed, roped

    @classmethod
    def empty(cls, cfg: ModelConfig, capacity: int, dtype: torch.dtype, device) -> AttnCache:
        # Rows past the valid length are never read, so the buffers need no zeroing (and
        # untouched pages cost nothing until a stream reaches them).
        kv = (capacity, cfg.num_kv_heads, cfg.head_dim)
        return cls(
            k=torch.empty(kv, dtype=dtype, device=device),
            v=torch.empty(kv, dtype=dtype, device=device),
            index_keys=torch.empty(capacity, cfg.indexer_head_dim, dtype=dtype, device=device),
            block_keys=torch.empty(
                capacity // cfg.indexer_block, cfg.indexer_head_dim, dtype=dtype, device=device
            ),
        )


@dataclass(slots=True)
class GdnState:
    conv: torch.Tensor  # [k-1, conv_dim] last conv inputs
    recurrent: torch.Tensor  # [HV, Dk, Dv] in the state dtype (fp32 on GPU, fp64 on CPU)


@dataclass(slots=True)
class PleState:
    conv: torch.Tensor  # [(k-1)*dilation, hc*H] last normed gated values
    ids: torch.Tensor  # [ngram_size - 1] last token ids (EOS before the sequence)


@dataclass(slots=True)
class SessionState:
    capacity: int
    attn: dict[int, AttnCache]
    gdn: dict[int, GdnState]
    ple: dict[int, PleState]
    mtp: list[AttnCache]
    length: int = 0  # committed positions of the target
    mtp_length: int = 0  # committed MTP cells
    # The target's pre-mixer residual of the last committed row: the MTP's next cell reads it.
    last_residual: torch.Tensor | None = field(default=None)

    @classmethod
    def empty(
        cls,
        cfg: ModelConfig,
        capacity: int,
        cache_dtype: torch.dtype,
        state_dtype: torch.dtype,
        device="cpu",
    ) -> SessionState:
        s = cls(capacity=capacity, attn={}, gdn={}, ple={}, mtp=[])
        for i, kind in enumerate(cfg.layer_types):
            if kind != "linear":  # sparse or full attention: a KV cache
                s.attn[i] = AttnCache.empty(cfg, capacity, cache_dtype, device)
            else:
                s.gdn[i] = GdnState(
                    conv=torch.zeros(
                        cfg.linear_conv_kernel - 1,
                        cfg.linear_conv_dim,
                        dtype=cache_dtype,
                        device=device,
                    ),
                    recurrent=torch.zeros(
                        cfg.linear_num_v_heads,
                        cfg.linear_k_head_dim,
                        cfg.linear_v_head_dim,
                        dtype=state_dtype,
                        device=device,
                    ),
                )
        for i in cfg.ple_layer_ids:
            s.ple[i] = PleState(
                conv=torch.zeros(
                    cfg.ple_tail, cfg.hc_count * cfg.hidden_size, dtype=cache_dtype, device=device
                ),
                ids=torch.full((cfg.ngram_size - 1,), cfg.ple_eos, dtype=torch.long, device=device),
            )
        s.mtp = [
            AttnCache.empty(cfg, capacity, cache_dtype, device) for _ in range(cfg.num_mtp_layers)
        ]
        return s

    def reset(self, cfg: ModelConfig) -> None:
        """Back to an empty sequence without reallocating."""
        self.length = self.mtp_length = 0
        self.last_residual = None
        for g in self.gdn.values():
            g.conv.zero_()
            g.recurrent.zero_()
        for p in self.ple.values():
            p.conv.zero_()
            p.ids.fill_(cfg.ple_eos)

    def attn_dtype(self) -> torch.dtype:
        return next(iter(self.attn.values())).k.dtype if self.attn else torch.float32

    def state_dtype(self) -> torch.dtype:
        return next(iter(self.gdn.values())).recurrent.dtype if self.gdn else torch.float32

    def tensors(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for c in [*self.attn.values(), *self.mtp]:
            out += [c.k, c.v, c.index_keys, c.block_keys]
        for g in self.gdn.values():
            out += [g.conv, g.recurrent]
        for p in self.ple.values():
            out += [p.conv, p.ids]
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
