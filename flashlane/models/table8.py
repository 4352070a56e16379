"""The n-gram (PLE) table in 8 bits: int8 values with one fp32 scale per table row.

Flash Next's tables are 51.2B values, 95.37 GiB in bf16: over the host's ceiling on a machine
of 128 GiB (planning/limits.py RAM_FRACTION), 47.7 GiB in 8 bits. A row is quantized alone
(symmetric, scale = absmax / 127, round half to even; a zero row gets scale 1 and zeros) and
read back as `q.float() * scale` cast to the compute dtype: the same bits whichever rows a
round reads with it, on every path (the reference gather, the Triton kernel's loads).
The 8-bit pair lives in host memory only (host_tables.py); `--ple-table-dtype` picks it.
"""

from __future__ import annotations

import logging
from typing import Literal

import torch
from torch import nn

logger = logging.getLogger(__name__)

TableDtype = Literal["bf16", "int8"]
TABLE_DTYPES = ("auto", "bf16", "int8")
# rows quantized at once: bounds the fp32 transient of a 1B-value table to ~64 MiB
_ROWS_AT_ONCE = 1 << 18


def quantize_rows(table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """table [R, D] (any float dtype, any device) -> (q [R, D] int8, scale [R] fp32) on the
    table's device: scale = absmax / 127 per row (1 for a row of zeros), q = x / scale
    rounded half to even."""
    rows = table.shape[0]
    q = torch.empty(table.shape, dtype=torch.int8, device=table.device)
    scale = torch.empty(rows, dtype=torch.float32, device=table.device)
    for start in range(0, rows, _ROWS_AT_ONCE):
        x = table[start : start + _ROWS_AT_ONCE].float()
        amax = x.abs().amax(dim=1)
        s = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
        q[start : start + x.shape[0]] = torch.round(x / s[:, None]).clamp_(-127, 127).to(torch.int8)
        scale[start : start + x.shape[0]] = s
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """q [..., D] int8 with scale [...] fp32 -> [..., D] in dtype: q.float() * scale, rounded
    to dtype once (the Triton ngram_embed's loads do the same two steps)."""
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


def int8_table_bytes(values: int, row_width: int) -> int:
    """Bytes of an 8-bit table of `values` values in rows of `row_width`: values + scales."""
    return values + 4 * (values // row_width)


class Int8Table(nn.Module):
    """An n-gram table's 8-bit pair, in NGramEmbedding.ngram_embedding's place: buffers `q`
    [R, D] int8 and `scale` [R] fp32; rows read back in `dtype` (the compute dtype)."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype):
        super().__init__()
        if q.dtype != torch.int8 or scale.dtype != torch.float32 or scale.shape != q.shape[:1]:
            raise ValueError(
                f"an 8-bit table is int8 [R, D] with fp32 [R] scales, got {q.dtype} "
                f"{tuple(q.shape)} and {scale.dtype} {tuple(scale.shape)}"
            )
        self.register_buffer("q", q)
        self.register_buffer("scale", scale)
        self.dtype = dtype

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scale.nbytes


def choose_table_dtype(
    requested: str, on_host: bool, values: int, row_width: int, elem: int, limit: int | None
) -> TableDtype:
    """`--ple-table-dtype`: bf16 or int8 as asked; auto: bf16 unless the tables go to host
    memory and `values` x `elem` bytes are over its `limit` while the 8-bit tables fit (one
    log line says so); over in both, bf16, and the memory plan's error names the remedies."""
    if requested not in TABLE_DTYPES:
        raise ValueError(f"ple_table_dtype must be auto, bf16 or int8, got {requested!r}")
    if requested != "auto":
        return requested  # type: ignore[return-value]
    if not on_host or limit is None or values * elem <= limit:
        return "bf16"
    small = int8_table_bytes(values, row_width)
    if small > limit:
        return "bf16"
    gib = 2**30
    logger.warning(
        "n-gram tables: %.2f GiB as the weights are over the host's %.2f GiB; kept in 8 bits "
        "(int8 with a per-row scale, %.2f GiB; --ple-table-dtype bf16 refuses instead)",
        values * elem / gib,
        limit / gib,
        small / gib,
    )
    return "int8"
