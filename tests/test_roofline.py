"""Roofline accounting (DESIGN.md section 9) on the real dimensions: the bytes a decode round
must move and the FLOPs a prefill must do, checked against hand counts."""

import pytest

from flashlane.models import census
from flashlane.models.config import ModelConfig
from flashlane.models.presets import preset
from flashlane.roofline import attention_bytes, decode_round_bytes, expected_experts, prefill_flops


@pytest.fixture(scope="module")
def cfg():
    return ModelConfig.from_hf(preset("flashnext-12l"))


def test_expected_experts_under_uniform_routing(cfg):
    assert expected_experts(cfg, 1) == pytest.approx(10)
    assert expected_experts(cfg, 2) == pytest.approx(512 * (1 - (502 / 512) ** 2))
    assert 10 * 16 > expected_experts(cfg, 16) > 130  # some experts are shared at 16 rows
    assert expected_experts(cfg, 10_000) == pytest.approx(512)


def test_one_stream_reads_every_dense_weight_and_ten_experts_a_layer(cfg):
    p = census.count_params(cfg)
    got = decode_round_bytes(cfg, rows=1, context=0)
    experts = cfg.num_layers * 10 * census.expert_params(cfg)
    dense = p.text - p.experts - p.embeddings
    ple = len(cfg.ple_layer_ids) * cfg.ple_embed_dim
    assert got["weights"] == 2 * (dense + experts + cfg.hidden_size + ple)
    assert got["kv"] == 0 and got["state"] == 2 * census.state_bytes_per_stream(cfg)
    assert got["total"] == pytest.approx(4.41e9, rel=0.01)  # the figure BENCHMARKS.md uses


def test_8bit_tables_move_a_byte_a_value_and_a_scale_a_row(cfg):
    whole = decode_round_bytes(cfg, rows=4, context=0)["weights"]
    eight = decode_round_bytes(cfg, rows=4, context=0, table_int8=True)["weights"]
    values = 4 * len(cfg.ple_layer_ids) * cfg.ple_embed_dim
    scales = 4 * len(cfg.ple_layer_ids) * cfg.num_ngram_heads
    assert whole - eight == pytest.approx(2 * values - (values + 4 * scales))


def test_prefill_flops_are_two_per_active_weight_plus_attention(cfg):
    p = census.count_params(cfg)
    dense_part = 2.0 * (p.active - cfg.hidden_size) * 2048
    got = prefill_flops(cfg, 2048)
    assert dense_part < got < dense_part * 1.1
    # past the indexer budget, attention grows linearly, not quadratically
    assert prefill_flops(cfg, 16384) < 9 * prefill_flops(cfg, 2048)


def test_a_sparse_layer_reads_its_budget_of_keys_and_every_pooled_key(cfg):
    """Issue 29: at 16k a sparse layer reads K and V of its 2,048 selected keys (not all
    16,384), every block's pooled indexer key (4,096 blocks of 4) and its current block's raw
    keys; below the budget it reads every key. Four rows read four times one row."""
    sparse = cfg.layer_types.count("sparse")
    assert sparse > 0 and cfg.layer_types.count("full") == 0
    kv_token = 2 * cfg.num_kv_heads * cfg.head_dim * 2
    key = cfg.indexer_head_dim * 2
    budget = cfg.indexer_top_blocks * cfg.indexer_block
    assert budget == 2048
    assert attention_bytes(cfg, 16384) == sparse * (
        2048 * kv_token + (16384 // cfg.indexer_block) * key + cfg.indexer_block * key
    )
    assert attention_bytes(cfg, 1000) == sparse * (
        1000 * kv_token + (1000 // cfg.indexer_block) * key + cfg.indexer_block * key
    )
    assert decode_round_bytes(cfg, 4, 16384)["kv"] == 4 * attention_bytes(cfg, 16384)
    # past the budget only the pooled keys grow
    grow = attention_bytes(cfg, 65536) - attention_bytes(cfg, 16384)
    assert grow == sparse * (65536 - 16384) // cfg.indexer_block * key


def test_an_8bit_cache_reads_a_byte_a_value_and_a_scale_a_row(cfg):
    """--kv-cache-dtype fp8: K, V and the raw keys pooled again at one byte a value plus an
    fp32 scale a row and head; the pooled keys stay in the compute dtype."""
    sparse, block = cfg.layer_types.count("sparse"), cfg.indexer_block
    kv_token = 2 * cfg.num_kv_heads * (cfg.head_dim + 4)
    raw, pooled = cfg.indexer_head_dim + 4, cfg.indexer_head_dim * 2
    assert attention_bytes(cfg, 16384, kv_fp8=True) == sparse * (
        2048 * kv_token + (16384 // block) * pooled + block * raw
    )
    eight = decode_round_bytes(cfg, 4, 16384, kv_fp8=True)["kv"]
    assert eight == 4 * attention_bytes(cfg, 16384, kv_fp8=True)
    # 0.61 of the plain read: the pooled keys, a quarter of it at 16k, are not 8-bit
    assert eight < 0.65 * decode_round_bytes(cfg, 4, 16384)["kv"]


def test_full_attention_reads_every_key():
    qwen = ModelConfig.from_hf(preset("qwen3-next-12l"))
    full = qwen.layer_types.count("full")
    assert full > 0 and qwen.layer_types.count("sparse") == 0
    kv_token = 2 * qwen.num_kv_heads * qwen.head_dim * 2
    assert attention_bytes(qwen, 16384) == full * 16384 * kv_token


def test_fp8_round_reads_one_byte_a_converted_value(cfg):
    from flashlane.models.fp8 import QuantSpec
    from flashlane.roofline import converted_dense_params

    p = census.count_params(cfg)
    spec = QuantSpec()
    dense = p.text - p.experts - p.embeddings
    converted = converted_dense_params(cfg, spec)
    assert 0 < converted < dense
    bf16 = decode_round_bytes(cfg, rows=1, context=0)["weights"]
    fp8 = decode_round_bytes(cfg, rows=1, context=0, fp8=spec)["weights"]
    # every converted value saves one byte, and its block's scale costs 4 / 16384 bytes
    saved = converted + cfg.num_layers * 10 * census.expert_params(cfg)
    assert fp8 == pytest.approx(bf16 - saved * (1 - 4 / 128**2), abs=1)
