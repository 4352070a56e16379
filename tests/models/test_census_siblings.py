"""census.count_params for the siblings against transformers 5.17 on the meta device, and the
published Qwen3-Next-80B-A3B figures (tests/data/README.md says where its config's values
come from)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from flashlane.models.census import count_params, kv_bytes_per_token, state_bytes_per_stream
from flashlane.models.config import ModelConfig
from flashlane.planning.info import describe
from flashlane.planning.memory import session_bytes
from tests.models.test_census import _assert_parts
from tests.oracle import SIBLINGS, hf_classes

transformers = pytest.importorskip("transformers")

QWEN3_NEXT_80B = Path(__file__).resolve().parents[1] / "data" / "qwen3_next_80b_a3b_config.json"
SHAPES = {
    **SIBLINGS,
    # every other layer dense (decoder_sparse_step) on top of mlp_only_layers; tied head
    "qwen3_next_step2": dict(
        SIBLINGS["qwen3_next"], decoder_sparse_step=2, tie_word_embeddings=True
    ),
}


def meta_model(raw: dict):
    raw = dict(raw)
    model_class, config_class = hf_classes(raw.pop("model_type"))
    hf_cfg = config_class(
        **{k: v for k, v in raw.items() if k not in ("architectures", "torch_dtype")}
    )
    with torch.device("meta"):
        return model_class(hf_cfg)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_sibling_configs_match_transformers(name: str) -> None:
    raw = copy.deepcopy(SHAPES[name])
    _assert_parts(ModelConfig.from_hf(raw), meta_model(raw))


def test_qwen3_next_80b_published_figures() -> None:
    raw = json.loads(QWEN3_NEXT_80B.read_text())
    cfg = ModelConfig.from_hf(raw)
    _assert_parts(cfg, meta_model(raw))
    counts = count_params(cfg)
    assert counts.total == 79_674_391_296  # "79.67B"
    assert counts.active_with_table == 3_874_929_408  # "3.87B active"
    assert counts.active == counts.active_with_table - 151_936 * 2048 + 2048
    # 12 attention layers x K and V x 2 heads x 256 x bf16; GDN: 36 layers of a 32 x 128 x
    # 128 fp32 state and 3 conv rows of 2 x 16 x 128 + 32 x 128 channels in bf16
    assert kv_bytes_per_token(cfg) == 24 * 1024
    assert kv_bytes_per_token(cfg, with_mtp=True) == 26 * 1024
    assert state_bytes_per_stream(cfg) == 36 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)
    text = describe(cfg)
    assert "79,674,391,296" in text and "3,874,929,408" in text and "gated full" in text


def test_session_sizes_per_family() -> None:
    """A session's bytes follow its family: the siblings' caches hold K and V alone (no
    indexer keys), their GDN states their own head counts."""
    for name, raw in SIBLINGS.items():
        cfg = ModelConfig.from_hf(raw)
        num_attn, num_gdn = cfg.num_attention_layers, cfg.layer_types.count("linear")
        kv = 2 * (num_attn + 1) * 100 * cfg.num_kv_heads * cfg.head_dim * 2
        state = num_gdn * (cfg.linear_num_v_heads * 16 * 16 * 4 + 3 * cfg.linear_conv_dim * 2)
        assert session_bytes(cfg, 100, 2, 4) == kv + state, name


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_qwen3_5_releases_count_as_transformers(family: str) -> None:
    """transformers' default Qwen3.5 configs (its "9B" and "35B-A3B style"), as a release's
    root config with the vision tower: every part and the total as transformers builds them."""
    names = {
        "qwen3_5": ("Qwen3_5Config", "Qwen3_5ForConditionalGeneration"),
        "qwen3_5_moe": ("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration"),
    }
    config_class, model_class = (getattr(transformers, n) for n in names[family])
    hf_cfg = config_class()
    with torch.device("meta"):
        model = model_class(hf_cfg)
    _assert_parts(ModelConfig.from_hf(hf_cfg.to_dict()), model)


def test_info_plans_qwen3_next_sessions(capsys) -> None:
    from flashlane.cli import main

    assert (
        main(
            [
                "info",
                str(QWEN3_NEXT_80B),
                "--slot-contexts",
                "65536,32768x3",
                "--memory-limit-gb",
                "200",
                "--device",
                "cuda",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    # per session: K and V of 12 layers and the MTP layer (2 x 2 heads x 256, bf16) a
    # position, no indexer keys, and 36 GDN layers' fp32 states and bf16 conv rows; on a GPU
    # its row of the lone driver's keyed-draw buffers (9 bytes a vocabulary id, 16 KiB besides)
    per_position = 13 * 2 * 2 * 256 * 2
    gdn = 36 * (32 * 128 * 128 * 4 + 3 * 8192 * 2)
    sessions = (65536 + 3 * 32768) * per_position + 4 * (gdn + 151_936 * 9 + 16384)
    assert sessions == 4676679168 and f"({sessions:,} bytes)" in out
    assert "79,674,391,296" in out and "65536,32768x3" in out
