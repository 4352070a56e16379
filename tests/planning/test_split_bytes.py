"""The plan counts the decode attention's split partials (kernels/attention/triton_walk.py),
the gathered attention's lists (triton_gather.py) and the listed attention's partials
(triton_listed.py)."""

import json
from pathlib import Path

import pytest

from flashlane.models.config import ModelConfig
from flashlane.planning.buffers import (
    LISTED_SLICES,
    SPLIT_KEYS,
    activation_bytes,
    split_partial_bytes,
)

DATA = Path(__file__).parents[1] / "data"


def config(name: str) -> ModelConfig:
    return ModelConfig.from_hf(json.loads((DATA / name).read_text()))


def test_the_plan_and_the_kernels_agree_on_a_range():
    walk = pytest.importorskip("flashlane.kernels.attention.triton_walk")
    gather = pytest.importorskip("flashlane.kernels.attention.triton_gather")
    listed = pytest.importorskip("flashlane.kernels.attention.triton_listed")
    assert SPLIT_KEYS == walk.SPLIT_KEYS == gather.RANGE_KEYS
    assert LISTED_SLICES == listed.SLICES


def test_partials_past_one_range_on_the_gpu_only():
    cfg = config("flashnext_real_config.json")
    lists = 64 * cfg.num_kv_heads * SPLIT_KEYS * 2  # a range's, int16
    part = 64 * cfg.num_attention_heads * (cfg.head_dim + 2) * 4  # 64 rows' partials, a range
    # one range: the listed attention's slices (the walk has no partials)
    assert split_partial_bytes(cfg, 64, SPLIT_KEYS) == LISTED_SLICES * part + lists
    assert split_partial_bytes(cfg, 64, 16 * SPLIT_KEYS) == LISTED_SLICES * part + 16 * lists
    full = split_partial_bytes(cfg, 64, 262144)  # 128 ranges: more than the slices
    assert full == 128 * (part + lists)
    gpu = activation_bytes(cfg, 64, "cuda", context=262144)
    assert gpu - activation_bytes(cfg, 64, "cuda", context=SPLIT_KEYS) == full - (
        LISTED_SLICES * part + lists
    )
    cpu = activation_bytes(cfg, 64, "cpu", context=262144)
    assert cpu == activation_bytes(cfg, 64, "cpu", context=SPLIT_KEYS)
    assert split_partial_bytes(config("qwen3_next_80b_a3b_config.json"), 64, 262144) == 0
