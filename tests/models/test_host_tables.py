"""The n-gram (PLE) tables in host memory (models/host_tables.py): where they go, the memory
plan's host bytes, and replies equal to the tables in place. On the CPU the host is the
device, so `--ple-table-device cpu` takes the host gather path (layers/ple.py
gather_on_host: rows gathered on the host by id and copied in) where the default reads the
table in place; the tests check that path runs and changes no bit."""

import pytest
import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.models.host_tables import device_bytes, host_bytes, table_place
from flashlane.models.layers import ple
from flashlane.request import SamplingParams

COSTS = CostTable({1: 1.0, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)


def test_table_place():
    assert table_place("cpu", "cuda", True) == "host"
    assert table_place("cuda", "cuda", False) == "device"
    assert table_place(None, "cuda", True) == "device"
    assert table_place("auto", "cuda", False) == "host"
    assert table_place(None, "cpu", False) == "device"  # a CPU model's device is the host
    assert table_place("cpu", "cpu", True) == "host"


def test_gather_on_host_equals_the_embedding():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(50, 6, generator=g)
    ids = torch.randint(0, 50, (2, 3, 4), generator=g)
    got = ple.gather_on_host(ids, table)
    assert got.shape == (2, 3, 4, 6)
    assert torch.equal(got, torch.nn.functional.embedding(ids, table))


@pytest.fixture(scope="module")
def twins(tiny_ckpt):
    """The tiny model with its tables in place and on the host."""
    return (
        LLM(str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16),
        LLM(str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16, ple_table_device="cpu"),
    )


def test_host_tables_reply_as_the_tables_in_place(twins, monkeypatch):
    calls = []

    def counted(ids, table):
        calls.append(tuple(ids.shape))
        return gather_on_host(ids, table)

    gather_on_host = ple.gather_on_host
    monkeypatch.setattr(ple, "gather_on_host", counted)
    in_place, on_host = twins
    prompts = [[5, 9, 13, 2, 7, 7, 30], [3, 4], list(range(3, 70))]
    params = [
        SamplingParams(max_tokens=8, temperature=0.0),
        SamplingParams(max_tokens=8, temperature=0.9, seed=4),
        SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, seed=11),
    ]
    want = [o.token_ids for o in in_place.generate(prompts, params)]
    assert not calls  # the tables in place never take the host path
    got = [o.token_ids for o in on_host.generate(prompts, params)]
    assert calls, "the host tables' rows were not gathered on the host"
    assert got == want
    ids = torch.tensor([prompts[2]])
    assert torch.equal(on_host.logits(ids[0]), in_place.logits(ids[0]))


def test_plan_counts_the_host_tables_apart(twins):
    in_place, on_host = twins
    model = on_host.engine.model
    table = host_bytes(model)
    assert table > 0 and host_bytes(in_place.engine.model) == 0
    assert on_host.engine.plan.host_bytes == table
    assert on_host.engine.plan.host_limit_bytes > 0
    assert in_place.engine.plan.host_limit_bytes is None
    assert on_host.engine.plan.weight_bytes == device_bytes(model)
    assert on_host.engine.plan.weight_bytes + table == in_place.engine.plan.weight_bytes
    assert "n-gram tables" in on_host.engine.summary(torch.float64, None)


def test_ple_table_device_is_checked(tiny_ckpt):
    with pytest.raises(ValueError, match="ple_table_device"):
        LLM(str(tiny_ckpt), ple_table_device="gpu")


def test_info_says_where_each_part_lives(tiny_ckpt, capsys):
    from flashlane.cli import main

    base = ["info", str(tiny_ckpt), "--device", "cuda", "--parallel", "2"]
    assert main([*base, "--ple-table-device", "cpu", "--quantization", "fp8"]) == 0
    out = capsys.readouterr().out
    assert "n-gram tables in host memory" in out and "host (n-gram table)" in out
    assert main(base) == 0  # auto: the tiny tables fit the GPU
    assert "weights and n-gram tables on cuda" in capsys.readouterr().out
