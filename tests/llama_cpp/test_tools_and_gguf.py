"""llama.cpp's benchmarks read back (fake tools print what b11434's print), and the lazy index
the converter reads: our random checkpoint under the checkpoint's names, the same numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from flashlane.llama_cpp import tools
from flashlane.llama_cpp.build import LlamaBuild
from flashlane.llama_cpp.write_gguf import random_index
from flashlane.models.loader import hf_tensors
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random, random_tensor

ROW = (
    '{"n_kv_max": 640, "n_batch": 2048, "n_ubatch": 512, "flash_attn": -1, '
    '"is_pp_shared": 0, "n_gpu_layers": 0, "n_threads": 2, "n_threads_batch": 2, '
    '"pp": 8, "tg": 4, "pl": %d, "n_kv": 48, "t_pp": 0.1, "speed_pp": 80.0, '
    '"t_tg": %f, "speed_tg": %f, "t": 0.3, "speed": 100.0}'
)
BENCH = [
    {
        "build_commit": "b11434",
        "build_number": 11434,
        "backends": "CPU",
        "gpu_info": "",
        "flash_attn": -1,
        "n_ubatch": 512,
        "n_prompt": 64,
        "n_gen": 0,
        "avg_ns": 2e8,
        "stddev_ns": 1e6,
        "avg_ts": 320.0,
        "stddev_ts": 1.5,
    }
]


def _fake_build(tmp_path: Path, batched: str, bench: str) -> LlamaBuild:
    """A build whose tools are Python scripts printing the given text (exit 3 on 'fail')."""
    for name, text in (("llama-batched-bench", batched), ("llama-bench", bench)):
        path = tmp_path / name
        code = 3 if text == "fail" else 0
        path.write_text(
            f"#!{sys.executable}\nimport sys\nsys.stderr.write('loading\\n')\n"
            f"print({text!r})\nsys.exit({code})\n"
        )
        path.chmod(0o755)
    return LlamaBuild(tmp_path, None, "b11434 (cpu)", {})


def test_decode_keeps_each_streams_second_run(tmp_path):
    rows = [ROW % (1, 0.5, 8.0), ROW % (1, 0.4, 10.0), ROW % (4, 0.5, 32.0), ROW % (4, 0.2, 80.0)]
    build = _fake_build(tmp_path, "\n".join(["| PP | TG |", *rows]), "[]")
    got = tools.decode(build, tmp_path / "m.gguf", [1, 4], 8, 4, gpu=False, threads=2)
    assert got["decode"] == {
        1: {"tok_s": 10.0, "round_ms": 100.0, "prompt_tok_s": 80.0, "flash_attn": -1},
        4: {"tok_s": 80.0, "round_ms": 50.0, "prompt_tok_s": 80.0, "flash_attn": -1},
    }
    cmd = got["command"]
    assert cmd[cmd.index("-npl") + 1] == "1,1,4,4" and cmd[cmd.index("-c") + 1] == "48"
    assert cmd[cmd.index("-ngl") + 1] == "0" and cmd[cmd.index("-t") + 1] == "2"
    with pytest.raises(RuntimeError, match=r"no row for \[16\]"):
        tools.decode(build, tmp_path / "m.gguf", [1, 16], 8, 4, gpu=True)


def test_prefill_reads_llama_bench_json_and_failures_are_errors(tmp_path):
    build = _fake_build(tmp_path, "fail", json.dumps(BENCH))
    got = tools.prefill(build, tmp_path / "m.gguf", [64], gpu=True)
    assert got["prefill"] == {64: {"tok_s": 320.0, "ttft_s": 0.2, "stddev_tok_s": 1.5}}
    assert got["build_commit"] == "b11434" and got["backends"] == "CPU"
    assert got["command"][got["command"].index("-ngl") + 1] == "999"
    with pytest.raises(RuntimeError, match="llama-batched-bench exited 3"):
        tools.decode(build, tmp_path / "m.gguf", [1], 8, 4, gpu=False)


def test_lazy_index_is_our_random_checkpoint_under_its_names():
    raw = preset("flashnext-tiny")
    index = random_index(raw, seed=3, device="cpu")
    _, model = build_random(raw, torch.bfloat16, "cpu", seed=3)
    saved = hf_tensors(model)  # what save_checkpoint writes: per-expert tensors
    fused = {n for n in index if n.endswith((".experts.gate_up_proj", ".experts.down_proj"))}
    assert fused and {n for n in saved if ".experts." not in n} == set(index) - fused
    for name, (shape, dtype, make) in index.items():
        value = make()
        assert tuple(value.shape) == tuple(shape) and value.dtype == dtype, name
        if name in saved:
            assert torch.equal(value, saved[name]), name
    gate_up = index["model.layers.0.mlp.experts.gate_up_proj"][2]()
    num_experts, half = gate_up.shape[0], gate_up.shape[1] // 2
    for e in (0, num_experts - 1):
        expert = f"model.layers.0.mlp.experts.{e}"
        assert torch.equal(gate_up[e, :half], saved[f"{expert}.gate_proj.weight"])
        assert torch.equal(gate_up[e, half:], saved[f"{expert}.up_proj.weight"])
    down = index["mtp.layers.0.mlp.experts.down_proj"][2]()
    assert torch.equal(
        down,
        random_tensor(
            "mtp.layers.0.mlp.experts.down_proj", tuple(down.shape), torch.bfloat16, "cpu", 3
        ),
    )
