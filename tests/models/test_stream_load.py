"""The loader reads a group at a time (a layer, a table, the rest) and a table in row chunks:
the same model as a whole read, host memory bounded by one group."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from flashlane.models import loader, stream_load
from flashlane.models.loader import CheckpointError, load_checkpoint, read_tensors
from flashlane.models.table8 import quantize_rows

TABLE = "layers.1.ple.ple_embedding.ngram_embedding"
SHARD = f"model.{TABLE}.shard_{{}}.weight"


@pytest.fixture
def ckpt(tmp_path, tiny_ckpt):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_ckpt, folder)
    return folder


def whole_table(folder, dtype=torch.float32):
    """The table as the whole checkpoint read at once gives it (its shards joined)."""
    return read_tensors(folder, dtype)[0][f"{TABLE}.weight"]


@pytest.mark.parametrize("place,kind", [("device", "bf16"), ("host", "bf16"), ("host", "int8")])
def test_a_table_read_in_chunks_across_its_shards_is_the_whole_table(
    ckpt, monkeypatch, place, kind
):
    monkeypatch.setattr(stream_load, "CHUNK_BYTES", 300 * 16 * 4)  # 300 rows: across shards
    reads = []
    real = stream_load.stream_table
    monkeypatch.setattr(
        stream_load, "stream_table", lambda *a, **k: reads.append(a[0]) or real(*a, **k)
    )
    _, model = load_checkpoint(ckpt, ple_tables=place, table_dtype=kind)
    assert len(reads) == 1 and len(reads[0]) == 4  # one table, its 4 shards
    table = model.get_submodule(TABLE)
    want = whole_table(ckpt)
    if kind == "int8":
        q, scale = quantize_rows(want)
        assert torch.equal(table.q, q) and torch.equal(table.scale, scale)
    else:
        assert torch.equal(table.weight, want)


def test_no_read_holds_more_than_one_group(ckpt, monkeypatch):
    calls = []
    real = loader.read_tensors
    monkeypatch.setattr(loader, "read_tensors", lambda *a, **k: calls.append(a[4]) or real(*a, **k))
    _, streamed = load_checkpoint(ckpt)
    names = list(load_file(str(ckpt / "model.safetensors")))
    assert len(calls) > 4 and max(len(c) for c in calls) < len(names) / 3
    for c in calls:  # one layer's tensors, or the rest; never the table's shards
        layers = {n.split(".")[2] for n in c if n.startswith("model.layers.")}
        assert len(layers) <= 1 and not any("ngram_embedding.shard" in n for n in c)
    # and the model is the one a whole read builds
    whole = read_tensors(ckpt, torch.float32)[0]
    state = streamed.state_dict()
    assert all(torch.equal(state[n], t) for n, t in whole.items() if n in state)


def test_shards_that_are_not_0_to_n_are_refused(ckpt):
    t = load_file(str(ckpt / "model.safetensors"))
    t[SHARD.format(7)] = t.pop(SHARD.format(3))
    save_file(t, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"shards are not 0\.\.3"):
        load_checkpoint(ckpt)


def test_a_table_of_the_wrong_size_names_both_shapes(ckpt):
    t = load_file(str(ckpt / "model.safetensors"))
    t[SHARD.format(3)] = t[SHARD.format(3)][:1000].clone()
    save_file(t, str(ckpt / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"\(4072, 16\), the config needs \(4096, 16\)"):
        load_checkpoint(ckpt)
