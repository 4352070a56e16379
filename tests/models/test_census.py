"""census.count_params against transformers 5.17 building the same configs on the meta device."""

from __future__ import annotations

import copy
import json
from collections import Counter

import pytest
import torch

from flashlane.models.census import (
    count_params,
    kv_bytes_per_token,
    ngram_head_sizes,
    ngram_table_rows,
    state_bytes_per_stream,
)
from flashlane.models.config import ModelConfig
from flashlane.planning.info import describe
from tests import DATA
from tests.oracle import TINY as ORACLE_TINY

transformers = pytest.importorskip("transformers")

REAL = DATA / "flashnext_real_config.json"
REAL_TOTAL = 177_392_830_576

# the REFERENCE.md tiny config, shared with the oracle checkpoints
TINY = ORACLE_TINY
# Another shape: PLE on two layers (global head ids go on), 3 streams, 4-grams, tied embeddings.
TINY_B = {
    **TINY,
    "num_hidden_layers": 6,
    "layer_types": ["linear_attention"] * 2
    + ["full_attention"]
    + ["linear_attention"] * 2
    + ["full_attention"],
    "ple_layer_ids": [1, 4],
    "hc_count": 3,
    "ngram_size": 4,
    "heads_per_ngram": 1,
    "ple_embed_dim": 48,
    "tie_word_embeddings": True,
    "make_ngram_vocab_size_divisible_by": 64,
    "shared_expert_intermediate_size": 24,
}


def _part(name: str) -> str:
    """Which ParamCounts field a transformers parameter name belongs to."""
    rules = [
        ("model.visual.", "vision"),
        ("ngram_embedding", "ngram_table"),
        (".ple.", "ple"),
        ("hyper_connection_mixer", "final_mixer"),
        ("_hyper_connection.", "hyper_connections"),
        ("linear_attn.", "gdn"),
        ("self_attn.", "attention"),
        ("mlp.experts.", "experts"),
        ("shared_expert", "shared_expert"),
        ("mlp.gate.", "router"),
        ("mlp.gate_proj", "mlp"),  # the siblings' dense MLPs, their norms and final norm
        ("mlp.up_proj", "mlp"),
        ("mlp.down_proj", "mlp"),
        ("layernorm", "hyper_connections"),
        ("model.norm.", "final_mixer"),
        ("embed_tokens", "embeddings"),
        ("lm_head", "lm_head"),
    ]
    for needle, part in rules:
        if needle in name:
            return part
    raise AssertionError(f"unclassified parameter {name}")


def _hf_parts(model: torch.nn.Module) -> Counter[str]:
    parts: Counter[str] = Counter()
    for name, p in model.named_parameters():
        parts[_part(name)] += p.numel()
    return parts


def _assert_parts(cfg: ModelConfig, model: torch.nn.Module) -> None:
    counts = count_params(cfg)
    hf = _hf_parts(model)
    ours = {part: getattr(counts, part) for part in hf}
    assert ours == dict(hf)
    assert counts.total == model.num_parameters()
    absent = {"vision", "lm_head"} - set(hf)
    assert all(getattr(counts, part) == 0 for part in absent)


@pytest.fixture(scope="module")
def real_raw() -> dict:
    return json.loads(REAL.read_text())


@pytest.mark.parametrize("spelling", ["qwen_sparse_attention", "full_attention"])
def test_real_config_matches_transformers(real_raw: dict, spelling: str) -> None:
    raw = copy.deepcopy(real_raw)
    text = raw["text_config"]
    text["layer_types"] = [t if t == "linear_attention" else spelling for t in text["layer_types"]]
    cfg = ModelConfig.from_hf(copy.deepcopy(raw))
    hf_cfg = transformers.Qwen4ExpConfig.from_dict(raw)
    with torch.device("meta"):
        model = transformers.Qwen4ExpForConditionalGeneration(hf_cfg)
    _assert_parts(cfg, model)
    counts = count_params(cfg)
    assert counts.total == REAL_TOTAL
    assert counts.text == 125_743_653_760
    assert counts.ngram_table == 320_001_536 * 160
    assert counts.vision == 448_931_056


@pytest.mark.parametrize("kwargs", [TINY, TINY_B], ids=["tiny", "tiny_b"])
def test_tiny_configs_match_transformers(kwargs: dict) -> None:
    hf_cfg = transformers.Qwen4ExpTextConfig(**copy.deepcopy(kwargs))
    cfg = ModelConfig.from_hf(hf_cfg.to_dict())
    with torch.device("meta"):
        model = transformers.Qwen4ExpForCausalLM(hf_cfg)
    _assert_parts(cfg, model)
    for layer in model.model.layers:
        if layer.ple is not None:
            emb = layer.ple.ple_embedding
            index = emb.ple_layer_index
            assert list(ngram_head_sizes(cfg, index)) == emb.head_vocab_sizes
            assert ngram_table_rows(cfg, index) == emb.ngram_embedding.num_embeddings


def test_real_figures(real_raw: dict) -> None:
    cfg = ModelConfig.from_hf(copy.deepcopy(real_raw))
    counts = count_params(cfg)
    # 12 layers x K and V x 2 heads x 256 x bf16 = 24 KiB; GDN states 36 x 3 MiB
    assert kv_bytes_per_token(cfg) == 24 * 1024
    assert kv_bytes_per_token(cfg, with_mtp=True) == 26 * 1024
    gdn_states = 36 * 48 * 128 * 128 * 4
    conv = 36 * 10240 * 3 * 2
    ple = 9 * 4 * 2560 * 2 + 2 * 8
    assert state_bytes_per_stream(cfg) == gdn_states + conv + ple
    assert 2.5e9 < counts.mtp < 2.7e9
    assert 5.5e9 < counts.active < 7e9
    text = describe(cfg)
    assert "177,392,830,576" in text and "51,200,245,760" in text and "24 KiB" in text
