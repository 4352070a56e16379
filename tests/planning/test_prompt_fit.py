"""Prompt pieces sized against the engine's measured start (planning.memory
.prompt_rows_that_fit): the CUDA graphs' pools are measured, not planned."""

import json
from pathlib import Path

from flashlane.models.census import count_params
from flashlane.models.config import ModelConfig
from flashlane.models.fp8 import QuantSpec
from flashlane.models.weight_bytes import fp8_bytes
from flashlane.planning.info_plan import H200_BYTES
from flashlane.planning.memory import GIB, plan_fitting, prompt_rows_that_fit, resolve_limit_bytes

REAL = Path(__file__).resolve().parents[1] / "data" / "flashnext_real_config.json"


def test_prompt_pieces_fit_beside_the_measured_start() -> None:
    """The full-size FP8 model as `bench model` planned it on the H200 (16 sessions of
    12,480, 16 rows, pieces of 8,192): its 8k prompt ran out of memory with 2.0 GiB of CUDA
    graph pools beside the plan. Measured at start, pools within the plan's allowance keep
    the pieces; 2 GiB halves them; nothing left stops at MIN_PREFILL_ROWS."""
    real = ModelConfig.from_hf(json.loads(REAL.read_text()))
    limit = resolve_limit_bytes(None, {}, "cuda", H200_BYTES)
    weights = fp8_bytes(real, QuantSpec()).total_bytes - 2 * count_params(real).ngram_table
    p = plan_fitting(real, device="cuda", limit_bytes=limit, weight_bytes=weights, context=12480,
                     max_rows=16, window_rows=1, parallel=16, prompt_rows=8192)  # fmt: skip
    assert (p.num_sessions, p.prompt_rows) == (16, 8192)
    start = p.weight_bytes + p.sessions_bytes
    assert prompt_rows_that_fit(p, real, start + GIB // 2) == 8192
    assert prompt_rows_that_fit(p, real, start + 2 * GIB) == 4096
    assert prompt_rows_that_fit(p, real, limit) == 2048


def test_the_engine_takes_the_fitted_pieces() -> None:
    """Pieces that do not fit beside the measured start shrink in the plan, the backend's
    limit and the host's rounds together (on the CPU with a start said to fill the limit)."""
    from flashlane.lanes.records import CostTable
    from flashlane.llm import LLM
    from flashlane.request import SamplingParams

    llm = LLM(costs=CostTable({1: 1.0}, draft_step_ms=0.3, overhead_ms=0.2), parallel=2)
    engine = llm.engine
    planned = engine.plan.prompt_rows
    engine.fit_prompt_pieces(engine.model_config, engine.plan.weight_bytes)
    assert engine.plan.prompt_rows == planned  # the plan's own start: nothing to shrink
    engine.fit_prompt_pieces(engine.model_config, engine.plan.limit_bytes)
    rows = engine.plan.prompt_rows
    assert rows < planned and engine.backend.max_prompt_rows == rows
    assert engine.host.config.prefill_rows == rows
    out = llm.generate(list(range(3, 3 + 3 * rows)), SamplingParams(max_tokens=2))[0]
    assert out.error is None and len(out.token_ids) == 2
