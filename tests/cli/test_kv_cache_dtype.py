"""--kv-cache-dtype (vLLM's name): auto (the default: the compute dtype, 8 bits with block-FP8
weights on a GPU that converts e4m3), bf16, fp8; a bad value, or a value the device cannot
keep, is refused with the reason."""

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


def test_auto_keeps_8_bit_caches_with_fp8_weights_on_a_gpu_that_converts_e4m3(monkeypatch):
    """engine_plan.auto_kv_fp8: a model holding an Fp8Weight on cuda of compute capability
    8.9 or later; not on the CPU, not on an older GPU, not with bf16 weights; kv_fp8_for
    takes it for auto only."""
    import torch
    from torch import nn

    from flashlane import engine_plan
    from flashlane.kernels.linear.fp8 import Fp8Weight

    fp8 = nn.Sequential(nn.Linear(4, 4), Fp8Weight.empty((128, 128)))
    plain = nn.Sequential(nn.Linear(4, 4))
    capability = [(9, 0)]
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability[0])
    assert engine_plan.auto_kv_fp8(fp8, "cuda")
    assert not engine_plan.auto_kv_fp8(plain, "cuda")
    assert not engine_plan.auto_kv_fp8(fp8, "cpu")
    capability[0] = (8, 0)
    assert not engine_plan.auto_kv_fp8(fp8, "cuda")
    capability[0] = (8, 9)
    bf16 = torch.bfloat16
    for asked, want in (("auto", True), ("fp8", True), ("bf16", False)):
        c = EngineConfig.resolve(kv_cache_dtype=asked)
        assert engine_plan.kv_fp8_for(c, bf16, fp8, "cuda", "reference") is want
        assert engine_plan.kv_fp8_for(c, bf16, plain, "cuda", "reference") is (asked == "fp8")


def test_info_plans_16_sessions_of_32k_for_the_real_model_in_fp8(monkeypatch, capsys):
    """Issue 34's plan: the published Flash Next with --quantization fp8 on an H200 (its host's
    128 GiB of RAM), --context 32768 and nothing else: 8-bit caches (auto), a row a session,
    the prompt cache yielding: 16 sessions. --kv-cache-dtype bf16 fits 9 (10 before each
    session counted its row of the keyed draws' buffers)."""
    from flashlane.cli import main
    from flashlane.planning import memory
    from tests import DATA

    monkeypatch.setattr(memory, "read_ram_bytes", lambda: 128 * 2**30)
    args = ["info", str(DATA / "flashnext_real_config.json"), "--quantization", "fp8"]
    assert main([*args, "--context", "32768"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1-byte e4m3" in out and "sessions 16 (auto): 32768x16 tokens" in out
    assert "verify scratch 1.70 GiB (1,823,735,808 bytes) (16 rows)" in out
    assert main([*args, "--context", "32768", "--kv-cache-dtype", "bf16"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "1-byte e4m3" not in out and "sessions 9 (auto): 32768x9 tokens" in out
