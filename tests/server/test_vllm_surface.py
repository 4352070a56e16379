"""What a vLLM client looks for beside the completions: /version, GET /v1/models/{id},
X-Request-Id on every response, and vLLM's request histograms at /metrics."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from flashlane import __version__
from tests.server.fake_engine import FakeEngine


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert m, f"{name} is not exported"
    return float(m.group(1))


def test_version(serve, tokenizer):
    live = serve(FakeEngine(tokenizer=tokenizer))
    assert httpx.get(f"{live.url}/version").json() == {"version": __version__}


def test_retrieve_a_model_by_id(serve, tokenizer):
    live = serve(FakeEngine(tokenizer=tokenizer), served_model_name="org/flash")
    client = live.client()
    card = client.models.retrieve("org/flash")  # an id with a slash, as hub ids have
    assert card.id == "org/flash" and card.object == "model"
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("other")
    assert err.value.body["code"] == "model_not_found"


def test_request_id_is_echoed_or_made(serve, tokenizer):
    live = serve(FakeEngine(tokenizer=tokenizer))
    raw = live.client().completions.with_raw_response.create(
        model="fake-flash", prompt="hi", max_tokens=2, extra_headers={"X-Request-Id": "abc-1"}
    )
    assert raw.headers["x-request-id"] == "abc-1"
    first = httpx.get(f"{live.url}/health").headers["x-request-id"]
    second = httpx.get(f"{live.url}/v1/models").headers["x-request-id"]
    assert len(first) == 32 and first != second
    bad = httpx.get(f"{live.url}/health", headers={"X-Request-Id": "a\tb"})
    assert bad.headers["x-request-id"] != "a\tb"  # not printable: a fresh one


def test_request_histograms_under_vllm_names(serve, tokenizer):
    live = serve(FakeEngine(tokenizer=tokenizer))
    client = live.client()
    replies = [
        client.completions.create(model="fake-flash", prompt="hello", max_tokens=n) for n in (3, 5)
    ]
    chunks = list(
        client.completions.create(model="fake-flash", prompt="hello", max_tokens=4, stream=True)
    )
    assert chunks
    text = httpx.get(f"{live.url}/metrics").text
    prompt = sum(r.usage.prompt_tokens for r in replies)
    assert metric(text, "vllm:request_prompt_tokens_count") == 3
    assert metric(text, "vllm:request_prompt_tokens_sum") == prompt + replies[0].usage.prompt_tokens
    assert metric(text, "vllm:request_generation_tokens_sum") == 3 + 5 + 4
    # every token after a reply's first is one inter-token observation (the fake engine
    # sends one token a snapshot)
    assert metric(text, "vllm:inter_token_latency_seconds_count") == 2 + 4 + 3
    for name in ("queue_time", "prefill_time", "decode_time"):
        assert metric(text, f"vllm:request_{name}_seconds_count") == 3
