"""A 20 MB body does not stall the other streams (issue 30, item 1): a server in a child
process streams one reply at a steady pace while 20 MB chat and /tokenize bodies arrive; the
gaps between that reply's events, and /health's answers, stay within 100 ms of their pace."""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import threading
import time

import httpx

from tests.server.test_serve import ROOT, free_port

CHILD = """
import argparse, sys
from flashlane.server.serve import add_serve_flags, serve_main
from tests.server.fake_engine import FakeEngine
parser = argparse.ArgumentParser()
add_serve_flags(parser)
serve_main(parser.parse_args(sys.argv[1:]), lambda: FakeEngine(delay=0.01))
"""
STALL_LIMIT = 0.1  # seconds a body may add to a gap between another stream's events


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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


# The bodies are built and sent by another process, so that the measuring one only reads.
SENDER = """
import json, sys, httpx
url = sys.argv[1]
text = "hello world " * (20 * 2**20 // 12)
chat = {"messages": [{"role": "user", "content": text}], "max_tokens": 5}
bodies = [("/v1/chat/completions", chat), ("/tokenize", {"prompt": text})]
out = []
with httpx.Client(timeout=120) as client:
    for path, body in bodies:
        content = json.dumps(body).encode()
        print("ready", flush=True) if not out else None
        sys.stdin.readline() if not out else None
        r = client.post(url + path, content=content, headers={"Content-Type": "application/json"})
        out.append((path, r.status_code, r.json()["error"]["code"]))
print(json.dumps(out), flush=True)
"""


def measure(url: str) -> dict:
    """Streams a reply, sends the big bodies meanwhile; gaps (s) before and during them."""
    times: list[float] = []
    health: list[float] = []
    window: list[float] = []
    done = threading.Event()

    def stream() -> None:
        body = {"prompt": "hello", "max_tokens": 1000, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    times.append(time.perf_counter())
                if done.is_set():
                    return

    def probe() -> None:
        with httpx.Client(timeout=60) as client:
            while not done.is_set():
                t = time.perf_counter()
                client.get(f"{url}/health")
                health.append(time.perf_counter() - t)
                time.sleep(0.02)

    sender = subprocess.Popen(
        [sys.executable, "-c", SENDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert sender.stdout is not None and sender.stdin is not None
    assert sender.stdout.readline().strip() == "ready"
    threads = [threading.Thread(target=stream), threading.Thread(target=probe)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    baseline = [b - a for a, b in itertools.pairwise(times)]
    calm_health = max(health)
    window.append(time.perf_counter())
    sender.stdin.write("go\n")
    sender.stdin.flush()
    statuses = json.loads(sender.stdout.readline())
    sender.wait(20)
    time.sleep(0.3)
    window.append(time.perf_counter())
    done.set()
    for thread in threads:
        thread.join(30)
    during = [b - a for a, b in itertools.pairwise(times) if window[0] <= b <= window[1]]
    return {
        "pace": statistics.median(baseline),
        "calm_gap": max(baseline),
        "gap": max(during),
        "events": len(during),
        "calm_health": calm_health,
        "health": max(health),
        "statuses": statuses,
        "seconds": window[1] - window[0],
    }


def stalled(m: dict) -> bool:
    return m["gap"] > m["pace"] + STALL_LIMIT or m["health"] > m["calm_health"] + STALL_LIMIT


def test_a_20mb_body_stalls_other_streams_under_100ms():
    # A stall the server causes shows in every attempt; one the machine's other load causes
    # (CI shares its cores) does not, so the best of three attempts is the server's.
    proc, url = start_server()
    try:
        attempts = []
        while len(attempts) < 3 and (not attempts or stalled(attempts[-1])):
            attempts.append(measure(url))
            print(json.dumps(attempts[-1]))
    finally:
        proc.terminate()
        proc.wait(20)
    m = attempts[-1]
    assert [s for _, s, _ in m["statuses"]] == [400, 400]
    assert all(code == "context_length_exceeded" for *_, code in m["statuses"])
    assert m["events"] > 10
    assert not stalled(m), attempts
