"""The 8-bit KV cache (--kv-cache-dtype fp8) on the GPU, bit for bit (DESIGN.md section 1):
Triton kernels reading e4m3 and row scales in their loads, CUDA graphs, the lone driver.
Replies served alone, batched, drafted, resumed from the prompt cache and moved agree
(sweep_gates.check_replies); staggered streams on random flashnext-4l (real per-layer
dimensions, engine defaults) equal each alone; a prompt's logits and state do not depend on
its pieces or its neighbours (test_pieces_gpu.fill over 8-bit sessions)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import tests.gpu.test_pieces_gpu as pieces
from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.graphs import Graphs
from tests.gpu.models import gpu_model_named
from tests.oracle import build_oracle
from tests.sweep_configs import sweep_configs
from tests.sweep_gates import check_replies

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


@pytest.mark.parametrize("index", [0, 5])
def test_8bit_replies_agree_every_way(tmp_path, index):
    spec = sweep_configs(20)[index]
    folder = build_oracle(tmp_path, spec, seed=index)
    seen = check_replies(folder, "cuda", spec["vocab_size"], kv_cache_dtype="fp8")
    assert seen["errors"] == 0 and seen["differ"] == 0, seen
    assert seen["compared"] > 0 and seen["cached_tokens"] > 0, seen


def test_8bit_staggered_replies_equal_alone():
    cfg, model = build_random(preset("flashnext-4l"), torch.bfloat16, "cuda", seed=3)
    config = EngineConfig.resolve(
        device="cuda", parallel=4, context=1024, prompt_cache_gb=0, kv_cache_dtype="fp8"
    )
    costs = CostTable(
        {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2
    )
    llm = LLM.from_engine(Engine(config, costs=costs, built=(cfg, model)))
    assert llm.engine.sessions[0].kv_fp8
    lens = [128, 150, 70, 200, 128, 64, 190, 131]
    prompts = [pieces.ids(cfg.vocab_size, n, 2000 + i) for i, n in enumerate(lens)]
    for base in (
        SamplingParams(temperature=0.0, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.95, seed=5, ignore_eos=True),
    ):
        plist = [dataclasses.replace(base, max_tokens=24 + 17 * (i % 4)) for i in range(8)]
        together = llm.generate(prompts, plist)
        for i, (prompt, p, got) in enumerate(zip(prompts, plist, together)):
            assert got.error is None
            undrafted = llm.generate(prompt, dataclasses.replace(p, draft=False))[0]
            assert got.token_ids == undrafted.token_ids, f"prompt {i} ({len(prompt)} tokens)"
    del llm
    torch.cuda.empty_cache()


@pytest.mark.parametrize("name", ["tiny", "flashnext-4l"])
def test_8bit_prompt_bits_do_not_depend_on_pieces(oracle_by_name, monkeypatch, name):
    cfg, model = gpu_model_named(name, oracle_by_name)
    model.graphs = Graphs(max_rows=64)

    def session(cfg, cap: int = pieces.CAP) -> SessionState:
        return SessionState.empty(cfg, cap, torch.bfloat16, torch.float32, "cuda", kv_fp8=True)

    monkeypatch.setattr(pieces, "new_session", session)
    prompt = pieces.ids(cfg.vocab_size, 150, 150)
    want_last, s = pieces.fill(cfg, model, prompt, "whole")
    assert s.kv_fp8
    want = pieces.greedy(model, s, int(want_last.argmax()))
    for schedule in ("cut", "packed", "packed_cut", "mixed"):
        last, s = pieces.fill(cfg, model, prompt, schedule)
        assert torch.equal(last, want_last), f"{schedule}: the prompt's last logits"
        got = pieces.greedy(model, s, int(last.argmax()))
        steps = (got != want).any(-1).nonzero().flatten().tolist()
        assert not steps, f"{schedule}: greedy steps {steps} differ"
    del model
    torch.cuda.empty_cache()
