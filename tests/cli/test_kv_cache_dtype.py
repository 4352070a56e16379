"""--kv-cache-dtype (vLLM's name): auto (the compute dtype, the default), bf16, fp8; a bad
value, or a value the device cannot keep, is refused with the reason."""

from __future__ import annotations

import pytest

from flashlane.cli import build_parser
from flashlane.config import EngineConfig
from flashlane.flags import engine_options


def test_the_default_is_the_compute_dtype():
    assert EngineConfig().kv_cache_dtype == "auto"
    assert EngineConfig.resolve(kv_cache_dtype="fp8").kv_cache_dtype == "fp8"


def test_a_bad_value_names_the_choices():
    with pytest.raises(ValueError, match=r"kv_cache_dtype: must be auto, bf16 or fp8, got 'e5m2'"):
        EngineConfig.resolve(kv_cache_dtype="e5m2")


def test_the_flag_reaches_the_field():
    args = build_parser().parse_args(["serve", "--kv-cache-dtype", "fp8"])
    assert EngineConfig.resolve(**engine_options(args)).kv_cache_dtype == "fp8"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--kv-cache-dtype", "int4"])


def test_bf16_is_refused_where_the_caches_compute_in_another_dtype():
    from flashlane.llm import LLM

    with pytest.raises(ValueError, match=r"kv-cache-dtype bf16: .*float64"):
        LLM(device="cpu", kv_cache_dtype="bf16", unpriced=True)
