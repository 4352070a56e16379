"""One stream's isolated state (a session), allocated once for a context capacity.

Per attention layer (and per MTP layer): K, V, raw indexer keys and pooled block keys
for `capacity` positions (a sibling's gated full attention has no indexer: its key buffers
are zero wide); per GDN layer: the conv window (last k-1 inputs) and the recurrent
state; per PLE layer: the dilated-conv tail and the last n-1 token ids. Attention buffers
are valid up to `length` (MTP: `mtp_length`): rolling back is lowering the length. With
--kv-cache-dtype fp8, K, V and the raw indexer keys are e4m3 with an fp32 scale per row and
head (kernels/attention/kv8.py); AttnCache writes and reads them (row_copies, keys).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from flashlane.kernels.attention import kv8
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
    # [capacity // block, Di] pooled, normed, roped: always the compute dtype (1/block of the
    # indexer keys' rows, pooled again from their dequantized values), so it names that dtype
    block_keys: torch.Tensor
    # --kv-cache-dtype fp8 (kernels/attention/kv8.py): k, v and index_keys hold e4m3, these
    # their fp32 scales, one per row and head; None: the values are stored as they are
    k_scale: torch.Tensor | None = None  # [capacity, Hkv]
    v_scale: torch.Tensor | None = None  # [capacity, Hkv]
    index_scale: torch.Tensor | None = None  # [capacity]

    @classmethod
    def empty(
        cls, cfg: ModelConfig, capacity: int, dtype: torch.dtype, device, fp8: bool = False
    ) -> AttnCache:
        # Rows past the valid length are never read, so the buffers need no zeroing (and
        # untouched pages cost nothing until a stream reaches them).
        kv = (capacity, cfg.num_kv_heads, cfg.head_dim)
        store = kv8.FP8 if fp8 else dtype
        scales = (
            dict(
                k_scale=torch.empty(kv[:2], dtype=torch.float32, device=device),
                v_scale=torch.empty(kv[:2], dtype=torch.float32, device=device),
                index_scale=torch.empty(capacity, dtype=torch.float32, device=device),
            )
            if fp8
            else {}
        )
        return cls(
            k=torch.empty(kv, dtype=store, device=device),
            v=torch.empty(kv, dtype=store, device=device),
            index_keys=torch.empty(capacity, cfg.indexer_head_dim, dtype=store, device=device),
            block_keys=torch.empty(
                capacity // cfg.indexer_block, cfg.indexer_head_dim, dtype=dtype, device=device
            ),
            **scales,
        )

    @property
    def fp8(self) -> bool:
        return self.k_scale is not None

    def tensors(self) -> list[torch.Tensor]:
        """Every buffer (the scales too, where the values are 8-bit)."""
        out = [self.k, self.v, self.index_keys, self.block_keys]
        return out + ([self.k_scale, self.v_scale, self.index_scale] if self.fp8 else [])

    def row_copies(self, s: int, e: int, k, v, raw=None) -> tuple[list, list]:
        """(destinations, sources) that store rows s..e-1: k, v [e-s, Hkv, D] and raw indexer
        keys [e-s, Di] (None: a cache without an indexer), quantized when 8-bit, for one
        multi-tensor copy (models.rows.copy_all)."""
        dsts = [self.k[s:e], self.v[s:e]] + ([] if raw is None else [self.index_keys[s:e]])
        srcs = [k, v] + ([] if raw is None else [raw])
        if not self.fp8:
            return dsts, srcs
        scales = [self.k_scale[s:e], self.v_scale[s:e]]
        scales += [] if raw is None else [self.index_scale[s:e]]
        pairs = [kv8.quantize(x) for x in srcs]
        # e4m3 as bytes: a multi-tensor copy of uint8 is one on every torch build
        values = [d.view(torch.uint8) for d in dsts], [q.view(torch.uint8) for q, _ in pairs]
        return values[0] + scales, values[1] + [sc for _, sc in pairs]

    def keys(self, e: int) -> torch.Tensor:
        """Rows 0..e-1 of K in the compute dtype [e, Hkv, D] (a view when not 8-bit)."""
        return self._read(self.k, self.k_scale, 0, e)

    def values(self, e: int) -> torch.Tensor:
        """Rows 0..e-1 of V in the compute dtype [e, Hkv, D]."""
        return self._read(self.v, self.v_scale, 0, e)

    def index_rows(self, s: int, e: int) -> torch.Tensor:
        """Raw indexer keys s..e-1 in the compute dtype [e-s, Di]."""
        return self._read(self.index_keys, self.index_scale, s, e)

    def _read(self, t: torch.Tensor, scale: torch.Tensor | None, s: int, e: int) -> torch.Tensor:
        if scale is None:
            return t[s:e]
        return kv8.dequantize(t[s:e], scale[s:e], self.block_keys.dtype)


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
        kv_fp8: bool = False,
    ) -> SessionState:
        """kv_fp8: the attention caches (the MTP layers' too) hold e4m3 values and scales."""
        s = cls(capacity=capacity, attn={}, gdn={}, ple={}, mtp=[])
        for i, kind in enumerate(cfg.layer_types):
            if kind != "linear":  # sparse or full attention: a KV cache
                s.attn[i] = AttnCache.empty(cfg, capacity, cache_dtype, device, kv_fp8)
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
            AttnCache.empty(cfg, capacity, cache_dtype, device, kv_fp8)
            for _ in range(cfg.num_mtp_layers)
        ]
        return s

    def reset(self, cfg: ModelConfig) -> None:
        """Back to an empty sequence without reallocating."""
        reset_all([self], cfg)

    def attn_dtype(self) -> torch.dtype:
        """The attention caches' compute dtype (their block keys'; K and V may be 8-bit)."""
        return next(iter(self.attn.values())).block_keys.dtype if self.attn else torch.float32

    @property
    def kv_fp8(self) -> bool:
        """The attention caches hold e4m3 values and scales (SessionState.empty's kv_fp8)."""
        return any(c.fp8 for c in [*self.attn.values(), *self.mtp])

    def state_dtype(self) -> torch.dtype:
        return next(iter(self.gdn.values())).recurrent.dtype if self.gdn else torch.float32

    def tensors(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for c in [*self.attn.values(), *self.mtp]:
            out += c.tensors()
        for g in self.gdn.values():
            out += [g.conv, g.recurrent]
        for p in self.ple.values():
            out += [p.conv, p.ids]
        return out

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def reset_all(sessions: list[SessionState], cfg: ModelConfig) -> None:
    """SessionState.reset for several sessions in a fixed number of launches (multi-tensor
    ops, not one launch a tensor and session): the recurrent states and conv windows zeroed,
    the PLE histories back to the end-of-text id."""
    zeros, ids = [], []
    for s in sessions:
        s.length = s.mtp_length = 0
        s.last_residual = None
        zeros += [t for g in s.gdn.values() for t in (g.conv, g.recurrent)]
        zeros += [p.conv for p in s.ple.values()]
        ids += [p.ids for p in s.ple.values()]
    kinds: dict[tuple, list[torch.Tensor]] = {}
    for t in zeros + ids:
        kinds.setdefault((t.device, t.dtype), []).append(t)
    for group in kinds.values():
        torch._foreach_zero_(group)
    if ids:
        torch._foreach_add_(ids, cfg.ple_eos)


def state_copies(
    src: SessionState, dst: SessionState, n: int, block: int, mtp: bool = True
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """(destinations, sources) that copy src's first n positions (the pooled keys of their
    complete blocks of `block`) and its GDN and PLE states into dst, for one multi-tensor
    copy (models.rows.copy_all); 8-bit values as bytes, with their scales. mtp: the MTP
    layers' caches too."""
    if n > dst.capacity or n > src.capacity:
        raise ValueError(f"sessions of {src.capacity} / {dst.capacity} positions cannot copy {n}")
    dsts: list[torch.Tensor] = []
    srcs: list[torch.Tensor] = []
    pairs = [*zip(src.attn.values(), dst.attn.values())]
    for a, b in pairs + ([*zip(src.mtp, dst.mtp)] if mtp else []):
        for x, y in zip(a.tensors(), b.tensors(), strict=True):
            m = n // block if x is a.block_keys else n
            x, y = (t.view(torch.uint8) if t.dtype == kv8.FP8 else t for t in (x[:m], y[:m]))
            dsts.append(y)
            srcs.append(x)
    for a, b in zip(src.gdn.values(), dst.gdn.values()):
        dsts += [b.conv, b.recurrent]
        srcs += [a.conv, a.recurrent]
    for a, b in zip(src.ple.values(), dst.ple.values()):
        dsts += [b.conv, b.ids]
        srcs += [a.conv, a.ids]
    return dsts, srcs
