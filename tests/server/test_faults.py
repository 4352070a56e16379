"""Faults and shutdown (issue 30, items 2 and 7): an engine whose thread raises ends every
request in flight with an error, /health turns 503 and `serve` exits 1; SIGTERM keeps the
port open and answers new requests 503 while it drains, and a second SIGTERM ends the drain."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from flashlane.lanes.records import CostTable
from flashlane.server.api import build_app
from flashlane.server.engine_thread import AsyncEngine
from tests.server.conftest import LiveServer
from tests.server.test_serve import ROOT, free_port, start, stream_in_thread

COSTS = CostTable({1: 10.0, 8: 14.0, 16: 20.0}, draft_step_ms=3.0, overhead_ms=1.0)
TRIGGER = 77  # a prompt starting with this token id makes the injected fault fire


def inject_fault(engine: AsyncEngine) -> None:
    """The engine thread raises in the first round that holds a request starting with TRIGGER."""
    host = engine.engine.host
    run_once = host.run_once

    def failing():
        if any(s.prompt_ids[:1] == [TRIGGER] for s in (*host.waiting, *host.live)):
            raise RuntimeError("injected fault")
        return run_once()

    host.run_once = failing


@pytest.fixture
def failing_server():
    engine = AsyncEngine(costs=COSTS, parallel=2, context=2048)
    inject_fault(engine)
    live = LiveServer(build_app(engine))
    yield engine, live
    live.stop()
    engine.close()


def test_2_an_engine_failure_ends_every_request_and_health_says_so(failing_server):
    engine, live = failing_server
    events: list[str] = []

    def stream() -> None:
        body = {"prompt": [5, 6, 7], "max_tokens": 400, "stream": True, "ignore_eos": True}
        with httpx.stream("POST", f"{live.url}/v1/completions", json=body, timeout=60) as r:
            events.extend(line for line in r.iter_lines() if line.startswith("data: "))

    thread = threading.Thread(target=stream)
    thread.start()
    deadline = time.monotonic() + 20
    while len(events) < 2:
        assert time.monotonic() < deadline, "the stream did not start"
        time.sleep(0.01)
    r = httpx.post(f"{live.url}/v1/completions", json={"prompt": [TRIGGER, 1]}, timeout=60)
    assert r.status_code == 500 and "injected fault" in r.json()["error"]["message"]
    thread.join(20)
    assert events[-1] == "data: [DONE]" and "injected fault" in events[-2]
    health = httpx.get(f"{live.url}/health")
    assert health.status_code == 503 and "injected fault" in health.json()["error"]
    r = httpx.post(f"{live.url}/v1/completions", json={"prompt": [5]}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_failed"
    assert engine.error is not None


CHILD = """
import argparse, sys
from flashlane.lanes.records import CostTable
from flashlane.server.engine_thread import AsyncEngine
from flashlane.server.serve import add_serve_flags, serve_main
from tests.server.test_faults import COSTS, inject_fault
parser = argparse.ArgumentParser()
add_serve_flags(parser)

def make():
    engine = AsyncEngine(costs=COSTS, parallel=2, context=2048)
    inject_fault(engine)
    return engine

serve_main(parser.parse_args(sys.argv[1:]), make)
"""


# The same with a fake engine that fails as AsyncEngine does (sets `error`, ends the request):
# serve's side of it in a second, where the real engine's start-up costs several.
CHILD_FAKE = """
import argparse, sys
from flashlane.request import FinishReason, RequestOutput
from flashlane.server.serve import add_serve_flags, serve_main
from tests.server.fake_engine import FakeEngine
from tests.server.test_faults import TRIGGER

class Failing(FakeEngine):
    async def _run(self, prompt_ids, params, request_id):
        if prompt_ids[:1] == [TRIGGER]:
            self.error = "the engine failed: RuntimeError: injected fault"
            error = FinishReason.ERROR
            yield RequestOutput(request_id, prompt_ids, [], "", error, 0, error=self.error)
            return
        async for out in super()._run(prompt_ids, params, request_id):
            yield out

parser = argparse.ArgumentParser()
add_serve_flags(parser)
serve_main(parser.parse_args(sys.argv[1:]), Failing)
"""


@pytest.mark.parametrize(
    "child", [CHILD_FAKE, pytest.param(CHILD, marks=pytest.mark.slow)], ids=["fake", "real"]
)
def test_2_serve_exits_non_zero_when_the_engine_fails(child):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", child, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline and proc.poll() is None, "no server"
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": [TRIGGER, 1]}, timeout=60)
        assert r.status_code == 500 and "injected fault" in r.text
        assert proc.wait(30) == 1
    finally:
        proc.kill()
    assert "injected fault" in proc.stdout.read()


def test_7_new_requests_get_503_while_draining_and_a_second_sigterm_ends_it():
    proc, url = start("--drain-timeout", "60")
    try:
        thread, events, first = stream_in_thread(url, 900)  # 900 tokens, 18 s at 20 ms
        assert first.wait(10)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"})  # a new connection
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down"
        assert httpx.get(f"{url}/health").json() == {"status": "draining"}
        assert proc.poll() is None and thread.is_alive()
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert time.monotonic() - began < 10  # not the 60 s drain
        thread.join(20)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
    finally:
        proc.kill()
