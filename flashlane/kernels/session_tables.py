"""Tables of offsets through which one kernel launch reads and writes many sessions' buffers
in place: the layout the kernels index (kernels/tables.py holds it as Triton constexprs) and
the builders that fill it from the sessions' tensors. Pure torch: the sessions' records
(models/state.py) are read by their field names only.
"""

from __future__ import annotations

from typing import Protocol

import torch

# attn_table's row per session: element offsets of its k, v, index_keys and block_keys from
# the first session's same tensor, then its block_keys rows, then (an 8-bit cache) the
# offsets of its k, v and index scales (padded to 8 int64s); gdn_table's: the offset of its
# recurrent state
TABLE_COLUMNS = (
    "k",
    "v",
    "index_keys",
    "block_keys",
    "blocks",
    "k_scale",
    "v_scale",
    "index_scale",
)
SCALE_COLUMNS = TABLE_COLUMNS[5:]
TABLE_WIDTH = 8
# the GDN table's columns: the recurrent state, then the conv window
GDN_CONV_COLUMN = 1
# the PLE table's columns: the conv tail, then the ids
PLE_IDS_COLUMN = 1


class AttnBuffers(Protocol):
    """One session's attention buffers for one layer (models.state.AttnCache)."""

    k: torch.Tensor  # [capacity, Hkv, D]
    v: torch.Tensor  # [capacity, Hkv, D]
    index_keys: torch.Tensor  # [capacity, Di]
    block_keys: torch.Tensor  # [capacity // block, Di]
    k_scale: torch.Tensor | None  # [capacity, Hkv] fp32 where k, v, index_keys are e4m3
    v_scale: torch.Tensor | None  # [capacity, Hkv]
    index_scale: torch.Tensor | None  # [capacity]


class GdnBuffers(Protocol):
    """One session's GDN buffers for one layer (models.state.GdnState)."""

    conv: torch.Tensor  # [k-1, conv_dim]
    recurrent: torch.Tensor  # [HV, Dk, Dv]


class PleBuffers(Protocol):
    """One session's PLE buffers for one layer (models.state.PleState)."""

    conv: torch.Tensor  # [(k-1)*dilation, hc*H]
    ids: torch.Tensor  # [ngram_size - 1]


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
    caches: list[AttnBuffers], anchor: AttnBuffers | None = None, host: bool = False
) -> torch.Tensor:
    """offsets_table of the sessions' attention buffers (TABLE_COLUMNS) for one layer, from
    the first cache's (or the anchor's)."""
    names = TABLE_COLUMNS[:4]
    columns = [[getattr(c, name) for c in caches] for name in names]
    bases = None if anchor is None else [getattr(anchor, name) for name in names]
    counts = [[c.block_keys.shape[0]] for c in caches]
    if caches[0].k_scale is not None:  # an 8-bit cache: its scales' offsets after the count
        scales = [[getattr(c, name) for c in caches] for name in SCALE_COLUMNS]
        bases8 = None if anchor is None else [getattr(anchor, name) for name in SCALE_COLUMNS]
        table = offsets_table(scales, align=[1, 1, 1], bases=bases8, host=True)
        counts = [n + row[:3] for n, row in zip(counts, table.tolist())]
    return offsets_table(columns, counts, bases=bases, host=host)


def gdn_table(
    states: list[GdnBuffers], anchor: GdnBuffers | None = None, host: bool = False
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


def ple_table(
    states: list[PleBuffers], anchor: PleBuffers | None = None, host: bool = False
) -> torch.Tensor:
    """offsets_table of the sessions' PLE conv tails and ids for one PLE layer, from the
    first state's (or the anchor's): kernels.gather_sessions and put_sessions read it."""
    bases = None if anchor is None else [anchor.conv, anchor.ids]
    return offsets_table(
        [[p.conv for p in states], [p.ids for p in states]], align=[1, 1], bases=bases, host=host
    )
