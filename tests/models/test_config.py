"""ModelConfig.from_hf: every spelling, and errors that name the field and the file."""

import json
from pathlib import Path

import pytest

from flashlane.models.config import ConfigError, ModelConfig
from tests import DATA
from tests.oracle import SIBLINGS, TINY

REAL = DATA / "flashnext_real_config.json"


def write(tmp_path, raw) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def text_config(**changes):
    raw = dict(TINY, model_type="qwen4_exp_text")
    raw.update(changes)
    return raw


@pytest.mark.parametrize(
    "spelling",
    ["full_attention", "qwen_sparse_attention", "deepseek_sparse_attention", "hybrid_indexed"],
)
def test_sparse_spellings(spelling):
    cfg = ModelConfig.from_hf(text_config(layer_types=["linear_attention"] * 3 + [spelling]))
    assert cfg.layer_types == ("linear",) * 3 + ("sparse",)


@pytest.mark.parametrize("model_type", ["qwen4_exp_text", "qwen3_8_flash_next"])
def test_text_model_types(model_type):
    assert ModelConfig.from_hf(text_config(model_type=model_type)).hidden_size == 64


def test_root_with_text_config():
    raw = {"model_type": "qwen4_exp", "text_config": text_config(), "tie_word_embeddings": False}
    cfg = ModelConfig.from_hf(raw)
    assert cfg.num_layers == 4 and cfg.ple_layer_ids == (1,)


def test_real_config_both_spellings(tmp_path):
    raw = json.loads(REAL.read_text())
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.hidden_size, cfg.num_layers, cfg.vocab_size) == (2560, 48, 248320)
    assert cfg.layer_types.count("sparse") == 12 and cfg.rotary_dim == 64
    raw["text_config"]["layer_types"] = [
        "full_attention" if t == "qwen_sparse_attention" else t
        for t in raw["text_config"]["layer_types"]
    ]
    assert ModelConfig.from_hf(write(tmp_path, raw)) == cfg


@pytest.mark.parametrize(
    "change, field",
    [
        ({"model_type": "llama"}, "model_type"),
        ({"model_type": "qwen3_moe"}, "model_type"),
        ({"hidden_size": "64"}, "hidden_size"),
        ({"num_attention_heads": -4}, "num_attention_heads"),
        ({"layer_types": ["linear_attention"] * 3 + ["mamba"]}, "layer_types[3]"),
        ({"layer_types": ["linear_attention"]}, "layer_types"),
        ({"ple_layer_ids": [4]}, "ple_layer_ids"),
        ({"indexer_kv_heads": 2}, "indexer_kv_heads"),
        ({"output_gate_type": "relu"}, "output_gate_type"),
    ],
)
def test_bad_config_names_field_and_file(tmp_path, change, field):
    folder = write(tmp_path, text_config(**change))
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_hf(folder)
    assert f"'{field}'" in str(err.value) and str(folder / "config.json") in str(err.value)


def test_missing_field_and_bad_json(tmp_path):
    raw = text_config()
    del raw["vocab_size"]
    with pytest.raises(ConfigError, match="'vocab_size' is missing"):
        ModelConfig.from_hf(write(tmp_path, raw))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_hf(tmp_path)


def sibling(name, **changes):
    raw = dict(SIBLINGS[name])
    raw.update(changes)
    return raw


def test_sibling_families_and_layer_kinds():
    for name in SIBLINGS:
        cfg = ModelConfig.from_hf(sibling(name))
        assert cfg.family == name and not cfg.has_hyper_connections
        assert "sparse" not in cfg.layer_types and cfg.layer_types.count("full") >= 1
        assert cfg.residual_width == cfg.hidden_size and cfg.indexer_head_dim == 0
        assert not cfg.ple_layer_ids
    # a Flash Next spelling of the sparse layer is no sibling's layer
    with pytest.raises(ConfigError, match="layer_types"):
        ModelConfig.from_hf(
            sibling("qwen3_next", layer_types=["linear_attention"] * 3 + ["qwen_sparse_attention"])
        )


def test_sibling_mlp_kinds():
    nxt = ModelConfig.from_hf(sibling("qwen3_next", mlp_only_layers=[0], decoder_sparse_step=2))
    assert nxt.dense_mlp_layers == (0, 2) and nxt.intermediate_size == 96
    assert [nxt.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    dense = ModelConfig.from_hf(sibling("qwen3_5"))
    assert dense.num_experts == 0 and not any(map(dense.is_moe_layer, range(5)))
    moe = ModelConfig.from_hf(sibling("qwen3_5_moe", norm_topk_prob=False))
    assert moe.norm_topk_prob and moe.dense_mlp_layers == ()  # 3.5-MoE always renormalises


@pytest.mark.parametrize("field", ["attention_bias", "mtp_use_dedicated_embeddings"])
def test_sibling_options_not_served_are_refused(field):
    with pytest.raises(ConfigError, match=f"'{field}'"):
        ModelConfig.from_hf(sibling("qwen3_next", **{field: True}))
    assert ModelConfig.from_hf(sibling("qwen3_next", **{field: False})).family == "qwen3_next"


def test_sibling_mtp_layer_spellings():
    assert ModelConfig.from_hf(sibling("qwen3_next")).num_mtp_layers == 1
    nextn = sibling("qwen3_next", num_nextn_predict_layers=2)
    assert ModelConfig.from_hf(nextn).num_mtp_layers == 2
    assert ModelConfig.from_hf(sibling("qwen3_5", mtp_num_hidden_layers=0)).num_mtp_layers == 0


def test_sibling_rope_defaults_and_root_config():
    raw = sibling("qwen3_next")
    del raw["rope_parameters"]
    raw.update(rope_theta=10_000_000, partial_rotary_factor=0.25)  # the published spelling
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.rotary_dim, cfg.rope_theta) == (8, 1e7)
    del raw["partial_rotary_factor"]  # Qwen3NextConfig's default is a quarter
    assert ModelConfig.from_hf(raw).rotary_dim == 8
    text = sibling("qwen3_5_moe", eos_token_id=None)
    root = {
        "model_type": "qwen3_5_moe",
        "text_config": text,
        "eos_token_id": 7,
        "vision_config": {"depth": 2},
    }
    cfg = ModelConfig.from_hf(root)
    assert cfg.family == "qwen3_5_moe" and cfg.eos_token_ids == (7,) and cfg.vision
