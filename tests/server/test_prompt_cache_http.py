"""The prompt cache over HTTP on the real engine: a resent prompt reports its cached tokens in
the usage and the same reply; /metrics counts the cache's queries, hits and kept bytes."""

from __future__ import annotations

import httpx
import torch

from flashlane.lanes.records import CostTable
from flashlane.server.api import build_app
from flashlane.server.engine_thread import AsyncEngine
from tests.server.conftest import LiveServer
from tests.server.test_ops import metric

COSTS = CostTable({1: 1.0, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)


def test_resent_completion_reports_cached_tokens_and_metrics(tiny_ckpt):
    engine = AsyncEngine(str(tiny_ckpt), costs=COSTS, parallel=2)
    live = LiveServer(build_app(engine))
    try:
        prompt = torch.randint(3, 500, (200,), generator=torch.Generator().manual_seed(3))
        body = {"prompt": prompt.tolist(), "max_tokens": 8, "temperature": 0.7, "seed": 5}
        replies = [
            httpx.post(f"{live.url}/v1/completions", json=body, timeout=60).json() for _ in range(2)
        ]
        cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies]
        assert cached == [0, 192]
        assert replies[0]["choices"][0]["text"] == replies[1]["choices"][0]["text"]
        text = httpx.get(f"{live.url}/metrics").text
        assert metric(text, "flashlane_prompt_cache_queries_total") == 2
        assert metric(text, "flashlane_prompt_cache_hits_total") == 1
        assert metric(text, "flashlane_prompt_cache_hit_tokens_total") == 192
        assert metric(text, "flashlane_prompt_cache_bytes") > 0
        assert metric(text, "flashlane_prompt_cached_tokens_total") == 192
    finally:
        live.stop()
        engine.close()
