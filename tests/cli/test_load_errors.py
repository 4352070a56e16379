"""Load failures a new user meets: one clear line and a non-zero exit before the server binds
its port (the supported architectures named, a CPU-only torch asked for cuda, a checkpoint
without tokenizer); missing mtp.* weights and a --dtype the CPU does not use are said."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import flashlane.server.serve as serve_module
from flashlane.cli import main
from flashlane.lanes.records import CostTable
from flashlane.llm import LLM

ROOT = Path(__file__).parents[2]
COSTS = CostTable({1: 1.0}, draft_step_ms=0.1, overhead_ms=0.1)


@pytest.fixture(autouse=True)
def no_server(monkeypatch):
    def bound(*args, **kwargs):
        raise AssertionError("the server started")

    monkeypatch.setattr(serve_module, "serve_main", bound)


def fails(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_a_folder_that_is_not_there(capsys, tmp_path):
    err = fails(capsys, "serve", str(tmp_path / "nothing"))
    assert "no such folder" in err


def test_unsupported_architecture_names_the_supported(capsys, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    err = fails(capsys, "serve", "--model", str(tmp_path))
    assert "'llama'" in err and "qwen4_exp" in err and "Qwen4ExpForCausalLM" in err


def test_checkpoint_without_tokenizer_is_refused_before_loading(capsys, tiny_ckpt):
    assert not (tiny_ckpt / "tokenizer.json").exists()
    err = fails(capsys, "serve", str(tiny_ckpt))
    assert "no tokenizer.json" in err
    err = fails(capsys, "generate", "-m", str(tiny_ckpt), "--prompt", "hi")
    assert "no tokenizer.json" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch without CUDA")
def test_device_cuda_on_a_cpu_torch(capsys):
    err = fails(capsys, "serve", "--device", "cuda")
    assert "CPU-only build" in err and "--device cpu" in err


def test_serve_process_exits_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "flashlane.cli", "serve", "no/such-model-here", "--port", "9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("flashlane: no/such-model-here: HF_HUB_OFFLINE is set")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_missing_mtp_weights_and_cpu_dtype_are_said(tiny_ckpt, tmp_path, caplog):
    folder = tmp_path / "no-mtp"
    shutil.copytree(tiny_ckpt, folder)
    weights = load_file(folder / "model.safetensors")
    assert any(n.startswith("mtp.") for n in weights)
    save_file(
        {n: t for n, t in weights.items() if not n.startswith("mtp.")},
        folder / "model.safetensors",
        metadata={"format": "pt"},
    )
    caplog.set_level(logging.INFO, logger="flashlane")
    llm = LLM(str(folder), costs=COSTS, parallel=1, max_rows=4, dtype="bfloat16")
    assert llm.engine.model.mtp is None
    text = caplog.text
    assert "no mtp.* weights: MTP drafts off, copy drafts only" in text
    assert "--dtype bfloat16: the CPU computes in float64" in text
    # the start-up summary, one fact a line
    assert "  sessions  1 x " in text and "  drafts    copy only (no MTP head)" in text
