"""The n-gram (PLE) tables in 8 bits (models/table8.py): the per-row quantization's round
trip, the reference paths that read it, the tiny model with 8-bit host tables (its logits
against the bf16 twin's, its replies batched and alone), the memory plan's host bytes and
`--ple-table-dtype`'s choices and errors. The Triton kernel's test on an 8-bit table:
tests/kernels/test_triton_ple.py; through mapped memory on a GPU: tests/gpu/test_fp8_gpu.py."""

import logging

import pytest
import torch

from flashlane.kernels.rowwise import reference as ref
from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.models import table8
from flashlane.models.census import count_params
from flashlane.models.host_tables import host_bytes, table_dtype_of
from flashlane.models.layers import ple
from flashlane.models.table8 import Int8Table, dequantize_rows, quantize_rows
from flashlane.planning import memory
from flashlane.request import SamplingParams

COSTS = CostTable({1: 1.0, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)


def _table(rows: int = 300, d: int = 24) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    # rows of very different sizes, a zero row, a row of one sign, exact halves
    t = torch.randn(rows, d, generator=g) * torch.logspace(-6, 2, rows)[:, None]
    t[7] = 0
    t[8] = t[8].abs()
    t[9] = torch.arange(d) - d / 2
    return t


def test_quantize_rows_round_trip_within_half_a_step():
    t = _table()
    q, scale = quantize_rows(t)
    assert q.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (300,)
    assert scale[7] == 1 and not q[7].any()  # a zero row: scale 1, zeros
    nonzero = torch.arange(300) != 7
    assert (q[nonzero].abs().amax(1) == 127).all()  # each row's absmax is +-127
    assert torch.equal(scale, torch.where(t.abs().amax(1) > 0, t.abs().amax(1) / 127, 1.0))
    err = (q.double() * scale.double()[:, None] - t.double()).abs().amax(1)
    assert (err <= scale.double() / 2 * (1 + 1e-6)).all()
    back = dequantize_rows(q, scale, torch.float32)
    assert torch.equal(back, q.float() * scale[:, None])
    assert torch.equal(dequantize_rows(q, scale, torch.bfloat16), back.bfloat16())


def test_quantize_rows_is_per_row(monkeypatch):
    t = _table()
    q, scale = quantize_rows(t)
    q2, s2 = quantize_rows(t[100:150])
    assert torch.equal(q2, q[100:150]) and torch.equal(s2, scale[100:150])
    monkeypatch.setattr(table8, "_ROWS_AT_ONCE", 7)  # slices of rows: the same bits
    q3, s3 = quantize_rows(t)
    assert torch.equal(q3, q) and torch.equal(s3, scale)
    # round half to even: 0.5 steps land on even integers
    halves = torch.tensor([[127.0, 0.5, 1.5, 2.5, -0.5, -2.5]])
    assert quantize_rows(halves)[0].tolist() == [[127, 0, 2, 2, 0, -2]]


def test_int8_table_checks_its_pair():
    with pytest.raises(ValueError, match="int8"):
        Int8Table(torch.zeros(4, 2), torch.ones(4), torch.float32)
    with pytest.raises(ValueError, match="fp32"):
        Int8Table(torch.zeros(4, 2, dtype=torch.int8), torch.ones(3), torch.float32)


def test_reference_and_host_gather_read_the_8bit_rows():
    t = _table()
    q, scale = quantize_rows(t)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 300, (2, 3, 4), generator=g)
    want = dequantize_rows(q[ids], scale[ids], torch.float64)
    got = ple.gather_on_host(ids, q, scale, torch.float64)
    assert got.dtype == torch.float64 and torch.equal(got, want)
    history = torch.randint(0, 9, (2, 2 + 5), generator=g)
    mult = torch.tensor([2**61 + 3, 2**62 - 57, 2**60 + 11])
    sizes = torch.tensor([31, 37, 41, 43])
    offsets = torch.cumsum(sizes, 0) - sizes
    args = (mult, sizes, offsets, 3, 2, 1)
    rows = ref.ngram_ids(history, *args)
    emb = ref.ngram_embed(history, *args, q, scale, torch.float64)
    assert torch.equal(emb, dequantize_rows(q[rows], scale[rows], torch.float64).flatten(-2))


def test_choose_table_dtype(caplog):
    choose = table8.choose_table_dtype
    assert choose("auto", True, 1000, 10, 2, 2000) == "bf16"  # fits as it is
    assert choose("auto", False, 1000, 10, 2, 100) == "bf16"  # on the device
    assert choose("auto", True, 1000, 10, 2, 1000) == "bf16"  # 8 bits (1400) do not fit
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        assert choose("auto", True, 1000, 10, 2, 1400) == "int8"
    assert len(caplog.records) == 1 and "8 bits" in caplog.records[0].getMessage()
    assert choose("int8", True, 1000, 10, 2, 10**9) == "int8"
    assert choose("bf16", True, 1000, 10, 2, 1) == "bf16"
    with pytest.raises(ValueError, match="auto, bf16 or int8"):
        choose("fp4", True, 1000, 10, 2, 1)
    assert table8.int8_table_bytes(1000, 10) == 1400


def test_plan_refusal_names_the_8bit_remedy(tiny_cfg):
    opts = dict(device="cuda", limit_bytes=2**40, weight_bytes=1, max_rows=4, context=64)
    with pytest.raises(memory.OverMemoryLimit, match="--ple-table-dtype int8"):
        memory.plan(tiny_cfg, **opts, host_bytes=10, host_limit_bytes=5)
    with pytest.raises(memory.OverMemoryLimit) as err:
        memory.plan(tiny_cfg, **opts, host_bytes=10, host_limit_bytes=5, host_dtype="int8")
    assert "ple-table-dtype" not in str(err.value)


@pytest.fixture(scope="module")
def tiny_cfg(tiny_ckpt):
    from flashlane.models.config import ModelConfig

    return ModelConfig.from_hf(tiny_ckpt)


@pytest.fixture(scope="module")
def pair(tiny_ckpt):
    """The tiny model with its tables as they are, and in 8 bits (in host memory)."""
    return (
        LLM(str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16),
        LLM(str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16, ple_table_dtype="int8"),
    )


def test_int8_tables_logits_near_the_bf16_twin(pair):
    whole, eight = pair
    assert table_dtype_of(eight.engine.model) == "int8"
    tables = [m for m in eight.engine.model.modules() if isinstance(m, Int8Table)]
    assert tables and all(t.q.device.type == "cpu" and t.dtype == torch.float64 for t in tables)
    ids = list(range(3, 60))
    a, b = whole.logits(ids), eight.logits(ids)
    assert not torch.equal(a, b)  # the tables' rounding reaches the logits
    # stated tolerance: the tables' 8-bit error (at most absmax/254 a value, ~0.2% of the
    # tiny tables' rows) moves a position's logits (of size ~2.5) by under 0.05, except where
    # it flips a discrete choice at a near tie (an expert's routing, the attention's top-k):
    # seen 0.006-0.04 at 55 of 57 positions, 1.3 and 1.9 at two
    worst = (a - b).abs().amax(1)
    assert (worst < 0.05).float().mean() >= 0.9, worst
    assert worst.median() < 0.02, worst


def test_int8_tables_logits_equal_the_dequantized_twin(tiny_ckpt, pair):
    """The bf16 model with each table replaced by its 8-bit values read back gives the 8-bit
    model's logits bit for bit: the 8-bit path reads exactly those values."""
    _, eight = pair
    twin = LLM(str(tiny_ckpt), costs=COSTS, parallel=1, max_rows=16)
    for m in twin.engine.model.modules():
        if isinstance(m, ple.NGramEmbedding):
            w = m.ngram_embedding.weight
            w.copy_(dequantize_rows(*quantize_rows(w), w.dtype))
    ids = list(range(3, 60))
    assert torch.equal(twin.logits(ids), eight.logits(ids))


def test_int8_tables_replies_batched_equal_alone(pair):
    _, eight = pair
    prompts = [[5, 9, 13, 2, 7, 7, 30], [3, 4], list(range(3, 70))]
    params = [
        SamplingParams(max_tokens=8, temperature=0.0),
        SamplingParams(max_tokens=8, temperature=0.9, seed=4),
        SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, seed=11),
    ]
    together = [o.token_ids for o in eight.generate(prompts, params)]
    alone = [eight.generate(p, sp)[0].token_ids for p, sp in zip(prompts, params)]
    assert together == alone and all(len(t) == 8 for t in together)


def test_plan_counts_the_8bit_host_bytes(pair, tiny_cfg):
    whole, eight = pair
    plan = eight.engine.plan
    values = count_params(tiny_cfg).ngram_table
    width = tiny_cfg.ple_embed_dim // tiny_cfg.num_ngram_heads
    assert plan.host_bytes == host_bytes(eight.engine.model) == values + 4 * (values // width)
    assert plan.host_dtype == "int8" and plan.host_limit_bytes > 0
    assert plan.weight_bytes + values * 8 == whole.engine.plan.weight_bytes  # float64 tables
    assert "in host memory (int8)" in eight.engine.summary(torch.float64, None)


def test_ple_table_dtype_is_checked(tiny_ckpt):
    with pytest.raises(ValueError, match="ple_table_dtype: must be auto, bf16 or int8"):
        LLM(str(tiny_ckpt), ple_table_dtype="fp4")
    with pytest.raises(ValueError, match="host memory only"):
        LLM(str(tiny_ckpt), ple_table_dtype="int8", ple_table_device="cuda")


def test_loader_refuses_8bit_tables_on_the_device(tiny_ckpt):
    from flashlane.models.loader import load_checkpoint

    with pytest.raises(ValueError, match="host memory only"):
        load_checkpoint(tiny_ckpt, table_dtype="int8")


def test_random_8bit_tables_are_the_quantized_bf16_ones():
    from flashlane.models.presets import preset
    from flashlane.models.random_weights import build_random

    raw = preset("flashnext-tiny")
    _, whole = build_random(raw, torch.bfloat16, "cpu", 2, ple_tables="host")
    _, eight = build_random(raw, torch.bfloat16, "cpu", 2, ple_tables="host", table_dtype="int8")
    pairs = [
        (a.ngram_embedding.weight, b.ngram_embedding)
        for a, b in zip(whole.modules(), eight.modules())
        if isinstance(a, ple.NGramEmbedding)
    ]
    assert pairs
    for w, t in pairs:
        q, scale = quantize_rows(w)
        assert torch.equal(t.q, q) and torch.equal(t.scale, scale) and t.dtype == torch.bfloat16


def test_info_shows_the_8bit_host_table(monkeypatch, capsys):
    """The real Flash Next's tables (95.37 GiB in bf16) on a machine of 128 GiB: auto keeps
    them in 8 bits (48.88 GiB, under the host's 89.60 GiB); bf16 is refused, naming int8."""
    from flashlane.cli import main
    from flashlane.planning import limits

    ram = lambda: 128 * 2**30  # noqa: E731
    monkeypatch.setattr(limits, "read_ram_bytes", ram)
    monkeypatch.setattr(memory, "read_ram_bytes", ram)
    args = ["info", "tests/data/flashnext_real_config.json", "--quantization", "fp8"]
    args += ["--context", "32768", "--device", "cuda", "--prompt-cache-gb", "0"]
    assert main([*args, "--memory-limit-gb", "137"]) == 0
    out = capsys.readouterr().out
    assert "n-gram tables in host memory, int8 with a per-row scale" in out
    assert "48.88 GiB (52,480,251,904 bytes) of     89.60 GiB" in out
    assert main([*args, "--memory-limit-gb", "137", "--ple-table-dtype", "bf16"]) != 0
    assert "95.37 GiB, over the 89.60 GiB" in capsys.readouterr().err
