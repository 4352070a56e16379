"""The embedded model behind the server, as a new user meets it through the openai client:
a plain chat answers in `content` and ends without max_tokens; /metrics carries vLLM's
names with vLLM's meanings (prefix-cache queries and hits in tokens, KV usage, preemptions
from the start); --seed numbers the seeds of requests that bring none."""

from __future__ import annotations

import re

import httpx
import pytest

from flashlane.lanes.records import CostTable
from flashlane.server.api import build_app
from flashlane.server.engine_thread import AsyncEngine
from tests.server.conftest import LiveServer
from tests.server.test_vllm_surface import metric

COSTS = CostTable({1: 1.0, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
# 70 lines of code: over one 64-token mark, so a second request resumes from the cache
PROMPT = "".join(f"value_{i} = compute({i}, limit={i * 3})\n" for i in range(70))


@pytest.fixture(scope="module")
def live():
    engine = AsyncEngine(costs=COSTS, parallel=2, context=4096, seed=1000)
    server = LiveServer(build_app(engine))
    yield engine, server
    server.stop()
    engine.close()


def test_plain_chat_answers_in_content_and_ends(live):
    engine, server = live
    assert engine.generation_defaults["max_new_tokens"] == 256
    reply = server.client().chat.completions.create(
        model="default_model",
        messages=[{"role": "user", "content": "Write a function that adds two numbers."}],
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.message.content  # not null: the think block starts closed
    assert getattr(choice.message, "reasoning_content", None) in (None, "")
    assert reply.usage.completion_tokens <= 256
    assert choice.finish_reason in ("stop", "length")
    # streamed too: the deltas carry content, no reasoning
    chunks = list(
        server.client().chat.completions.create(
            model="default_model",
            messages=[{"role": "user", "content": "Sort a list."}],
            max_tokens=8,
            temperature=0,
            stream=True,
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas)
    assert not any(getattr(d, "reasoning_content", None) for d in deltas)


def test_engine_metrics_mean_what_vllm_means(live):
    _, server = live
    text = httpx.get(f"{server.url}/metrics").text
    assert metric(text, "vllm:num_preemptions_total") == 0  # there before any pause
    assert metric(text, "vllm:kv_cache_usage_perc") == 0
    queries = metric(text, "vllm:prefix_cache_queries_total")
    hits = metric(text, "vllm:prefix_cache_hits_total")
    client = server.client()
    usages = [
        client.completions.create(
            model="default_model", prompt=PROMPT, max_tokens=2, temperature=0
        ).usage
        for _ in range(2)
    ]
    text = httpx.get(f"{server.url}/metrics").text
    assert usages[1].prompt_tokens_details.cached_tokens > 0
    # tokens, not requests: every prompt token is queried, the resumed ones are hits
    assert metric(text, "vllm:prefix_cache_queries_total") - queries == sum(
        u.prompt_tokens for u in usages
    )
    assert metric(text, "vllm:prefix_cache_hits_total") - hits == sum(
        u.prompt_tokens_details.cached_tokens for u in usages
    )
    assert metric(text, "flashlane_session_moves_total") == 0


# what vLLM's Grafana dashboard (examples/observability/prometheus_grafana/grafana.json) reads
DASHBOARD = (
    "vllm:e2e_request_latency_seconds_count",
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:inter_token_latency_seconds_count",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_count",
    "vllm:kv_cache_usage_perc",
    "vllm:request_prompt_tokens_count",
    "vllm:request_generation_tokens_count",
    "vllm:request_success_total",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
)


def test_what_vllms_dashboard_reads_is_there(live):
    _, server = live
    server.client().completions.create(model="default_model", prompt="x", max_tokens=3)
    text = httpx.get(f"{server.url}/metrics").text
    for name in DASHBOARD:
        labels = re.search(rf"^{re.escape(name)}{{([^}}]*)}} ", text, re.M)
        assert labels and 'model_name="default_model"' in labels.group(1), name


def test_seed_flag_numbers_requests_without_one(live):
    _, server = live
    client = server.client()
    seeds = [
        client.completions.create(model="default_model", prompt="x = ", max_tokens=1).model_extra[
            "seed"
        ]
        for _ in range(2)
    ]
    assert seeds[1] == seeds[0] + 1 and seeds[0] >= 1000
