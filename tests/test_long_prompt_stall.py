"""benchmarks/long_prompt_stall.py (issue 29's stall measure) runs end to end on a tiny random
model: three runs of one engine, the long prompt's TTFT alone and beside the decoders, and
the decoders' gaps with and without it."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path


def test_stall_measure_runs_on_a_tiny_model(capsys, monkeypatch):
    path = Path(__file__).parents[1] / "benchmarks" / "long_prompt_stall.py"
    spec = importlib.util.spec_from_file_location("long_prompt_stall", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    argv = ["long_prompt_stall.py", "--config", "flashnext-tiny", "--streams", "2"]
    monkeypatch.setattr(sys, "argv", [*argv, "--prompt-len", "200", "--decode-tokens", "12"])
    bench.main()
    out = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert out["model"] == "flashnext-tiny" and out["streams"] == 2
    assert out["ttft_alone_s"] > 0 and out["ttft_beside_s"] > 0
    for name in ("without", "beside"):
        assert 0 < out[name]["gap_p99_s"] <= out[name]["longest_gap_s"]
    assert math.isfinite(out["gap_p99_ratio"]) and math.isfinite(out["ttft_ratio"])
