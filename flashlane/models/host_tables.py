"""Where the n-gram (PLE) tables live: on the model's device, or in host memory.

Flash Next's tables are 51.2B values (102 GB in bf16): beside the FP8 text model they do not
fit one H200, and a round reads only a few of their rows (heads x rows of the round per PLE
layer). In host memory they are pinned in place (cudaHostRegister, mapped: no copy, and none
of the caching host allocator's rounding up to a power of two) so that the GPU's
`ngram_embed` kernel reads the round's rows through mapped memory, inside CUDA graphs too;
with the reference kernels each call's rows are gathered on the host and copied in
(layers/ple.py `gather_on_host`), which is also the CPU's path when the tables are "host".
In host memory a table may also be kept in 8 bits (table8.py: int8 with a per-row scale).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

from flashlane.models.layers.ple import NGramEmbedding
from flashlane.models.table8 import Int8Table, TableDtype, quantize_rows

TablePlace = Literal["device", "host"]
TABLE_SUFFIX = "ngram_embedding.weight"
# cudaHostRegisterPortable | cudaHostRegisterMapped: every context sees it, at a device address
_REGISTER_FLAGS = 1 | 2


def table_place(requested: str | None, device: str, fits_on_device: bool) -> TablePlace:
    """`--ple-table-device`: "cpu" -> host, "cuda" -> device, None / "auto" -> the device when
    the memory plan fits the tables there (`fits_on_device`), else the host. A CPU model's
    device is the host: "device" there unless asked for "cpu" (the gather path)."""
    if requested == "cpu":
        return "host"
    if requested == "cuda" or not device.startswith("cuda"):
        return "device"
    return "device" if fits_on_device else "host"


def pinned(t: torch.Tensor) -> torch.Tensor:
    """t (a CPU tensor) page-locked in place and mapped for the GPU where CUDA is there; as it
    is elsewhere. The registration lasts as long as the process (the tables are never
    freed while a model serves)."""
    t = t.contiguous()
    if not torch.cuda.is_available() or t.numel() == 0 or t.is_pinned():
        return t
    err = torch.cuda.cudart().cudaHostRegister(
        t.data_ptr(), t.numel() * t.element_size(), _REGISTER_FLAGS
    )
    if int(err) != 0:
        raise RuntimeError(f"cudaHostRegister of an n-gram table failed: {err}")
    return t


def is_table(name: str) -> bool:
    """Whether a parameter (our name) is an n-gram table."""
    return name.endswith(TABLE_SUFFIX)


def mark_tables(model: nn.Module, place: TablePlace) -> None:
    """Tell every PLE layer where its table is (after the loader put it there)."""
    for m in model.modules():
        if isinstance(m, NGramEmbedding):
            m.on_host = place == "host"


def expect_int8_tables(model: nn.Module, dtype: torch.dtype) -> None:
    """Every PLE layer of `model` (built on the meta device) made to hold an 8-bit table
    (an empty Int8Table, read back in `dtype`): its state's names become
    `...ngram_embedding.q` and `.scale` for load_state_dict(assign=True) to fill."""
    for m in model.modules():
        if isinstance(m, NGramEmbedding):
            rows, width = m.ngram_embedding.weight.shape
            q = torch.empty((rows, width), dtype=torch.int8, device="meta")
            scale = torch.empty(rows, dtype=torch.float32, device="meta")
            m.ngram_embedding = Int8Table(q, scale, dtype)


def int8_state(name: str, table: torch.Tensor) -> dict[str, torch.Tensor]:
    """Table `name` (our `...ngram_embedding.weight`) [R, D] as its 8-bit pair in pinned
    host memory, under the names expect_int8_tables gives them."""
    base = name.removesuffix(".weight")
    q, scale = quantize_rows(table)
    return {base + ".q": pinned(q.cpu()), base + ".scale": pinned(scale.cpu())}


def host_state(name: str, table: torch.Tensor, table_dtype: TableDtype) -> dict:
    """Table `name` [R, D] as the state of a table in host memory: pinned as it is (bf16),
    or its 8-bit pair (int8_state)."""
    return int8_state(name, table) if table_dtype == "int8" else {name: pinned(table)}


def check_table_dtype(table_dtype: TableDtype, place: TablePlace) -> None:
    if table_dtype == "int8" and place != "host":
        raise ValueError("8-bit n-gram tables live in host memory only (ple_tables='host')")


def table_dtype_of(model: nn.Module) -> TableDtype:
    """The dtype the model's n-gram tables are kept in: int8 (8-bit pairs) or bf16 (as the
    weights)."""
    eight = any(isinstance(m, Int8Table) for m in model.modules())
    return "int8" if eight else "bf16"


def _host_tables(model: nn.Module) -> list[torch.Tensor]:
    out = []
    for m in model.modules():
        if isinstance(m, NGramEmbedding) and m.on_host:
            table = m.ngram_embedding
            out += [table.q, table.scale] if isinstance(table, Int8Table) else [table.weight]
    return out


def host_bytes(model: nn.Module) -> int:
    """The bytes of the model's n-gram tables in host memory."""
    return sum(t.numel() * t.element_size() for t in _host_tables(model))


def device_bytes(model: nn.Module) -> int:
    """The bytes of the model's parameters on its device: all but the host's tables."""
    host = {id(t) for t in _host_tables(model)}
    return sum(p.numel() * p.element_size() for p in model.parameters() if id(p) not in host)
