"""serve_main in a child process: SIGTERM stops admitting, lets live streams finish, exits 0."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).parents[2]
CHILD = """
import argparse, sys
from flashlane.server.serve import add_serve_flags, serve_main
from tests.server.fake_engine import FakeEngine
parser = argparse.ArgumentParser()
add_serve_flags(parser)
serve_main(parser.parse_args(sys.argv[1:]), lambda: FakeEngine(delay=0.02))
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(*flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = ["--port", str(port), "--log-level", "info", *flags]
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, "the server did not come up"
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.05)


def stream_in_thread(
    url: str, max_tokens: int
) -> tuple[threading.Thread, list[str], threading.Event]:
    events: list[str] = []
    first = threading.Event()

    def run() -> None:
        body = {"prompt": "hello", "max_tokens": max_tokens, "stream": True}
        headers = {"Authorization": "Bearer k"}
        with httpx.stream(
            "POST", f"{url}/v1/completions", json=body, headers=headers, timeout=30
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    first.set()

    thread = threading.Thread(target=run)
    thread.start()
    return thread, events, first


def test_sigterm_drains_live_streams_and_exits_0():
    proc, url = start("--api-key", "k")
    try:
        thread, events, first = stream_in_thread(url, 40)
        assert first.wait(10)
        proc.send_signal(signal.SIGTERM)
        thread.join(20)
        assert events[-1] == "[DONE]"
        finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
        assert finishes[-1] == "length"
        assert proc.wait(20) == 0
    finally:
        proc.kill()
    log = proc.stdout.read()
    assert "POST /v1/completions 200" in log and "finish=length" in log


def test_sigterm_cancels_streams_past_the_drain_timeout():
    proc, url = start("--drain-timeout", "0.3", "--api-key", "k")
    try:
        thread, events, first = stream_in_thread(url, 900)
        assert first.wait(10)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        thread.join(20)
        assert events[-1] == "[DONE]" and len(events) < 200
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"
        assert "finish=abort" in proc.stdout.read()
    finally:
        proc.kill()
