"""A checkpoint read a group at a time: host memory holds one layer, never the whole model.

The real Flash Next is 355 GB in bf16 and its n-gram table alone 102 GB, against a GPU
machine's 128 GiB of host memory: `loader.load_checkpoint` reads the tensors of one group (a
decoder layer, an MTP layer, the rest), converts them as a whole checkpoint would be (FP8
scales, shards, expert stacks, fused projections all stay inside a group) and moves them to
their device before it reads the next. An n-gram table is read in row chunks straight into
its place (the device, or pinned host memory, as it is or as 8-bit rows): the same values
as a whole read, since every conversion on the way is row by row.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import torch

from flashlane.models import host_tables
from flashlane.models.fp8 import SCALE_SUFFIX
from flashlane.models.table8 import quantize_rows

LAYER = re.compile(r"^(mtp\.)?layers\.(\d+)\.")
SHARD = re.compile(r"^(.*\.ngram_embedding)\.shard_(\d+)\.weight$")
CHUNK_BYTES = 1 << 28  # a table's rows read at a time: 256 MiB of the checkpoint's dtype


class CheckpointError(ValueError):
    """A checkpoint that does not fit the config: names the tensor, the file and the shapes."""


def table_base(ours: str) -> str | None:
    """`...ngram_embedding` for an n-gram table or one of its shards (our names), else None."""
    m = SHARD.match(ours)
    if m:
        return m.group(1)
    return ours.removesuffix(".weight") if host_tables.is_table(ours) else None


def groups(ours: dict[str, str]) -> list[list[str]]:
    """Checkpoint names (keys of `ours`, checkpoint name -> our name) in the groups they are
    read in: each table with its shards, each decoder layer, each MTP layer, the rest; in
    that order within a sorted walk (the tables first: the largest allocations before the
    heap fragments)."""
    by: dict[tuple, list[str]] = defaultdict(list)
    for name, our in ours.items():
        base = table_base(our)
        if base is not None:
            key: tuple = (0, base)
        else:
            m = LAYER.match(our)
            key = (1, m.group(1) or "", int(m.group(2))) if m else (2,)
        by[key].append(name)
    return [sorted(by[k]) for k in sorted(by)]


def is_streamable(names: list[str], ours: dict[str, str], handles: dict, fresh) -> bool:
    """Whether this group is a plain table (its shards): no FP8 tensors or scales, nothing a
    quantization at load converts."""
    if not all(table_base(ours[n]) is not None for n in names):
        return False
    if any(n.endswith(SCALE_SUFFIX) for n in names):
        return False
    if fresh is not None and any(fresh.is_converted(n) for n in names):
        return False
    return all(handles[n].get_slice(n).get_dtype() in ("BF16", "F16", "F32") for n in names)


def stream_table(
    names: list[str],
    ours: dict[str, str],
    handles: dict,
    want: tuple[int, ...],
    dtype: torch.dtype,
    device: str | torch.device,
    host: bool,
    table_dtype: str,
) -> tuple[str, dict[str, torch.Tensor], tuple[int, ...]]:
    """The table these checkpoint names hold (one tensor, or shards 0..n-1 joined by rows) as
    load_checkpoint's state would hold it: on `device` in dtype, or (host) pinned in host
    memory in dtype or as 8-bit rows. Returns (our name, its state, the shape read); the
    state is empty when the shape is not `want` (the caller reports it)."""
    parts = sorted(names, key=lambda n: _shard_index(ours[n]))
    base = table_base(ours[parts[0]])
    name = f"{base}.weight"
    slices = [handles[n].get_slice(n) for n in parts]
    shapes = [tuple(s.get_shape()) for s in slices]
    width = shapes[0][1] if len(shapes[0]) == 2 else -1
    shape = (sum(s[0] for s in shapes), width)
    if shape != tuple(want) or any(len(s) != 2 or s[1] != width for s in shapes):
        return name, {}, shape if all(len(s) == 2 for s in shapes) else shapes[0]
    eight = host and table_dtype == "int8"
    where = "cpu" if host else device
    if eight:
        out = torch.empty(shape, dtype=torch.int8)
        scale = torch.empty(shape[0], dtype=torch.float32)
    else:
        out = torch.empty(shape, dtype=dtype, device=where)
    step = max(1, CHUNK_BYTES // max(1, width * 4))
    row = 0
    for s, (rows, _) in zip(slices, shapes):
        for a in range(0, rows, step):
            x = s[a : min(rows, a + step)].to(dtype)
            n = x.shape[0]
            if eight:
                out[row : row + n], scale[row : row + n] = quantize_rows(x)
            else:
                out[row : row + n].copy_(x)
            row += n
    if eight:
        pair = {base + ".q": host_tables.pinned(out), base + ".scale": host_tables.pinned(scale)}
        return name, pair, shape
    return name, {name: host_tables.pinned(out) if host else out}, shape


def check_shape(n: str, t: torch.Tensor, expected: dict, origin: dict) -> None:
    if n not in expected:
        raise CheckpointError(f"{origin[n]}: unexpected tensor {n!r} with shape {tuple(t.shape)}")
    if tuple(t.shape) != tuple(expected[n].shape):
        raise CheckpointError(
            f"{origin[n]}: tensor {n!r} has shape {tuple(t.shape)}, "
            f"the config needs {tuple(expected[n].shape)}"
        )


def load_table(names, ours, handles, files, model, state, origin, dtype, device, place, kind):
    """An n-gram table (or its shards) read in row chunks into its place (py)."""
    base, where = table_base(ours[names[0]]), files[names[0]]
    if not shard_indices_ok(names, ours):
        raise CheckpointError(f"{where}: {base} shards are not 0..{len(names) - 1}")
    name, expected = base + ".weight", dict(model.state_dict())
    origin[name] = where
    want = expected.get(base + ".q" if kind == "int8" else name)
    if want is None:
        shape = handles[names[0]].get_slice(names[0]).get_shape()
        raise CheckpointError(f"{where}: unexpected tensor {name!r} with shape {tuple(shape)}")
    host = place == "host"
    _, part, shape = stream_table(
        names, ours, handles, tuple(want.shape), dtype, device, host, kind
    )
    if not part:
        raise CheckpointError(
            f"{where}: tensor {name!r} has shape {tuple(shape)}, "
            f"the config needs {tuple(want.shape)}"
        )
    state.update(part)


def _shard_index(our: str) -> int:
    m = SHARD.match(our)
    return int(m.group(2)) if m else 0


def shard_indices_ok(names: list[str], ours: dict[str, str]) -> bool:
    """A table's parts are one tensor or shards 0..n-1."""
    idx = sorted(_shard_index(ours[n]) for n in names)
    if len(names) == 1:
        return True
    return all(SHARD.match(ours[n]) for n in names) and idx == list(range(len(names)))


def open_handles(files: dict[str, Path], names: list[str], open_file) -> dict:
    """Checkpoint name -> its file's safe_open handle, one handle a file."""
    by_file: dict[Path, object] = {}
    out = {}
    for n in names:
        f = files[n]
        if f not in by_file:
            by_file[f] = open_file(f)
        out[n] = by_file[f]
    return out
