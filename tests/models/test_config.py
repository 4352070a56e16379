"""ModelConfig.from_hf: every spelling, and errors that name the field and the file."""

import json
from pathlib import Path

import pytest

from flashlane.models.config import ConfigError, ModelConfig
from tests import DATA
from tests.oracle import TINY

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
        ({"model_type": "qwen3_next"}, "model_type"),
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
