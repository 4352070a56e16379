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

from flashlane.models.config import ModelConfig


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


# attn_table's row per session: element offsets of its k, v, index_keys and block_keys from
# the first session's same tensor, then its block_keys rows (padded to 8 int64s); gdn_table's:
# the offset of its recurrent state
TABLE_COLUMNS = ("k", "v", "index_keys", "block_keys", "blocks")
TABLE_WIDTH = 8


def offsets_table(
    columns: list[list[torch.Tensor]],
    counts: list[list[int]] | None = None,
    align: list[int] | None = None,
    bases: list[torch.Tensor] | None = None,
    host: bool = False,
) -> torch.Tensor:
    """[B, TABLE_WIDTH] int64 on the tensors' device: row b holds the element offset of
    columns[c][b] from columns[c][0] (or from bases[c], the buffer a kernel is handed:
    runner/lone.py's step graphs, one per batch size, name any sessions through it) for each
    column c, then counts[b], so one kernel reads and writes B sessions' buffers in place
    (the lone driver's steps of several sessions). Offsets are whole multiples of align[c]
    elements, 16 unless given (the allocator's buffers are aligned; a kernel may rely on
    it); they may be negative. host: the table stays on the CPU."""
    b = len(columns[0])
    rows = [[] for _ in range(b)]
    bases = bases or [tensors[0] for tensors in columns]
    for tensors, step, t0 in zip(columns, align or [16] * len(columns), bases):
        for row, t in zip(rows, tensors):
            if t.dtype != t0.dtype or not t.is_contiguous():
                raise ValueError(
                    f"offsets_table: a buffer of {t.dtype} (first {t0.dtype}), "
                    f"contiguous {t.is_contiguous()}"
                )
            off, rem = divmod(t.data_ptr() - t0.data_ptr(), t.element_size())
            if rem or off % step:
                raise ValueError(f"offsets_table: a buffer {off} elements (+{rem} bytes) away")
            row.append(off)
    for row, extra in zip(rows, counts or [[]] * b):
        row += extra + [0] * (TABLE_WIDTH - len(row) - len(extra))
    table = torch.tensor(rows, dtype=torch.long)
    return table if host else table.to(columns[0][0].device)


def attn_table(
    caches: list[AttnCache], anchor: AttnCache | None = None, host: bool = False
) -> torch.Tensor:
    """offsets_table of the sessions' attention buffers (TABLE_COLUMNS) for one layer, from
    the first cache's (or the anchor's)."""
    names = TABLE_COLUMNS[:4]
    columns = [[getattr(c, name) for c in caches] for name in names]
    bases = None if anchor is None else [getattr(anchor, name) for name in names]
    return offsets_table(columns, [[c.block_keys.shape[0]] for c in caches], bases=bases, host=host)


@dataclass(slots=True)
class GdnState:
    conv: torch.Tensor  # [k-1, conv_dim] last conv inputs
    recurrent: torch.Tensor  # [HV, Dk, Dv] in the state dtype (fp32 on GPU, fp64 on CPU)


# the GDN table's columns: the recurrent state, then the conv window
GDN_CONV_COLUMN = 1


def gdn_table(
    states: list[GdnState], anchor: GdnState | None = None, host: bool = False
) -> torch.Tensor:
    """offsets_table of the sessions' recurrent states and conv windows for one GDN layer,
    from the first state's (or the anchor's)."""
    bases = None if anchor is None else [anchor.recurrent, anchor.conv]
    return offsets_table(
        [[g.recurrent for g in states], [g.conv for g in states]],
        align=[16, 1],  # small windows: the CPU allocator's 64 bytes
        bases=bases,
        host=host,
    )


@dataclass(slots=True)
class PleState:
    conv: torch.Tensor  # [(k-1)*dilation, hc*H] last normed gated values
    ids: torch.Tensor  # [ngram_size - 1] last token ids (EOS before the sequence)


# the PLE table's columns: the conv tail, then the ids
PLE_IDS_COLUMN = 1


def ple_table(
    states: list[PleState], anchor: PleState | None = None, host: bool = False
) -> torch.Tensor:
    """offsets_table of the sessions' PLE conv tails and ids for one PLE layer, from the
    first state's (or the anchor's): kernels.gather_sessions and put_sessions read it."""
    bases = None if anchor is None else [anchor.conv, anchor.ids]
    return offsets_table(
        [[p.conv for p in states], [p.ids for p in states]], align=[1, 1], bases=bases, host=host
    )


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
