"""Operations: /health while loading, disconnects abort, /metrics counts, logs, draining."""

from __future__ import annotations

import logging
import socket
import time

import httpx
import pytest

from flashlane.server.api import attach_engine, build_app, engine_failed, start_draining
from tests.server.conftest import LiveServer
from tests.server.fake_engine import FakeEngine

USER = [{"role": "user", "content": "hi"}]


def wait_for(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_health_is_503_while_loading_then_ok(tokenizer):
    app = build_app(served_model_name="flash")
    live = LiveServer(app)
    try:
        r = httpx.get(f"{live.url}/health")
        assert (r.status_code, r.json()) == (503, {"status": "loading"})
        r = httpx.post(f"{live.url}/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
        attach_engine(app, FakeEngine(tokenizer=tokenizer))
        assert httpx.get(f"{live.url}/health").json() == {"status": "ok"}
        assert [m.id for m in live.client().models.list()] == ["flash"]
        reply = live.client().completions.create(model="flash", prompt="hi", max_tokens=2)
        assert reply.model == "flash"
        start_draining(app)
        r = httpx.get(f"{live.url}/health")
        assert (r.status_code, r.json()) == (503, {"status": "draining"})
        r = httpx.post(f"{live.url}/v1/completions", json={"prompt": "hi"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
    finally:
        live.stop()


def test_failed_load_is_reported():
    app = build_app()
    engine_failed(app, "OverMemoryLimit: too big")
    live = LiveServer(app)
    try:
        r = httpx.get(f"{live.url}/health")
        assert r.status_code == 503 and "too big" in r.json()["error"]
    finally:
        live.stop()


def raw_request(url: str, path: str, body: bytes) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


@pytest.mark.parametrize("stream", [False, True])
def test_client_disconnect_aborts_the_request(serve, tokenizer, stream):
    engine = FakeEngine(tokenizer=tokenizer, delay=0.02)
    live = serve(engine)
    body = b'{"prompt": "hello", "max_tokens": 200, "stream": %s}' % (
        b"true" if stream else b"false"
    )
    sock = raw_request(live.url, "/v1/completions", body)
    wait_for(lambda: len(engine.started) == 1 and engine.live)
    if stream:
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    sock.close()
    wait_for(lambda: engine.aborted == [engine.started[0][0]])
    wait_for(lambda: not engine.live)


def metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def test_metrics_match_what_clients_received(serve, tokenizer, caplog):
    engine = FakeEngine(tokenizer=tokenizer)
    live = serve(engine)
    client = live.client()
    caplog.set_level(logging.INFO, logger="flashlane.server")
    replies = [
        client.completions.create(model="fake-flash", prompt="hello", max_tokens=5)
        for _ in range(3)
    ]
    chunks = list(
        client.chat.completions.create(
            model="fake-flash",
            messages=USER,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    usages = [r.usage for r in replies] + [chunks[-1].usage]
    # a streamed reply's bookkeeping may finish just after its last chunk reached the client
    deadline = time.monotonic() + 5
    while True:
        text = httpx.get(f"{live.url}/metrics").text
        done = metric(text, 'flashlane_request_success_total{finished_reason="length"}') == 4
        idle = metric(text, "flashlane_replies_in_flight") == 0
        idle = idle and metric(text, "vllm:num_requests_running") == 0
        if (done and idle) or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    generated = sum(u.completion_tokens for u in usages)
    prompt = sum(u.prompt_tokens for u in usages)
    assert metric(text, "flashlane_generation_tokens_total") == generated
    assert metric(text, 'vllm:generation_tokens_total{model_name="fake-flash"}') == generated
    assert metric(text, "vllm:prompt_tokens_total") == prompt
    assert metric(text, 'flashlane_request_success_total{finished_reason="length"}') == 4
    assert metric(text, "vllm:time_to_first_token_seconds_count") == 4
    assert metric(text, "vllm:e2e_request_latency_seconds_count") == 4
    assert metric(text, "flashlane_prompt_cached_tokens_total") == sum(
        u.prompt_tokens_details.cached_tokens for u in usages
    )
    assert metric(text, "flashlane_accepted_tokens_total") == engine.num_tokens
    assert metric(text, "vllm:num_requests_running") == 0
    assert metric(text, "flashlane_replies_in_flight") == 0
    assert metric(text, "flashlane_sessions_total") == 4
    routes = 'flashlane_http_requests_total{route="/v1/completions",status="200"}'
    assert metric(text, routes) == 3
    lines = [r.getMessage() for r in caplog.records if "/v1/" in r.getMessage()]
    assert len(lines) == 4 and "prompt=" in lines[0] and "finish=length" in lines[0]
