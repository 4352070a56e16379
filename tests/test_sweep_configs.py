"""The sweep's configs build as transformers checkpoints, load in flashlane, and span the space."""

import torch

from flashlane.models.config import ModelConfig
from flashlane.models.loader import load_checkpoint
from tests.oracle import build_oracle
from tests.sweep_configs import sweep_configs


def test_every_config_builds_and_loads(tmp_path):
    for i, spec in enumerate(sweep_configs()):
        folder = build_oracle(tmp_path / str(i), spec, seed=i)
        cfg, model = load_checkpoint(folder, dtype=torch.float32)
        assert cfg == ModelConfig.from_hf(folder)
        assert (model.mtp is not None) == (spec["mtp_num_hidden_layers"] > 0), i
        assert cfg.hc_count == spec["hc_count"] and cfg.vocab_size == spec["vocab_size"]


def test_configs_span_the_space():
    specs = [ModelConfig.from_hf(dict(s, model_type="qwen4_exp_text")) for s in sweep_configs()]
    first = specs[0]
    assert (first.hc_count, first.hidden_size, first.vocab_size) == (3, 96, 1000)
    assert (first.linear_k_head_dim, first.linear_v_head_dim) == (32, 16)
    assert (first.num_experts, first.num_experts_per_tok) == (12, 3)
    assert {c.hc_count for c in specs} == {2, 3, 4, 5, 6}
    assert len({c.hc_lowrank for c in specs}) >= 3
    assert sum(c.linear_k_head_dim != c.linear_v_head_dim for c in specs) >= 5
    assert any(c.num_attention_heads & (c.num_attention_heads - 1) for c in specs)
    assert any(c.num_experts % 2 for c in specs)
    assert any(c.vocab_size % 64 for c in specs)
    assert len({c.ple_layer_ids for c in specs}) >= 3 and any(not c.ple_layer_ids for c in specs)
    assert len({(c.indexer_budget, c.indexer_block) for c in specs}) >= 5
    assert {c.num_mtp_layers for c in specs} == {0, 1}
    assert all(c.hidden_size <= 128 and 2 <= c.num_layers <= 4 for c in specs)


def test_configs_are_seeded():
    assert sweep_configs(5, seed=1) == sweep_configs(5, seed=1)
    assert sweep_configs(5, seed=1) != sweep_configs(5, seed=2)
