"""Load against the real engine and the embedded model: 64 concurrent streaming clients for a
while (10 s in CI; 60 s marked slow), zero errors, every reply complete and equal to the same
request alone, /metrics consistent with what the clients received, and the sessions of
clients that disconnect mid-reply come back."""

from __future__ import annotations

import asyncio
import json
import re
import time

import httpx
import pytest

from flashlane.lanes.records import CostTable
from flashlane.server.api import build_app
from flashlane.server.engine_thread import AsyncEngine
from tests.server.conftest import LiveServer

COSTS = CostTable({1: 10.0, 8: 14.0, 16: 20.0}, draft_step_ms=3.0, overhead_ms=1.0)
PROMPTS = [
    "import os\n",
    "def main():\n",
    "class Queue:\n",
    '"""Utilities."""\n',
    "for key in sorted(d):\n",
    "try:\n    import re\n",
    "x = []\n",
    "def f(a, b):\n",
]


@pytest.fixture(scope="module")
def server():
    engine = AsyncEngine(costs=COSTS, parallel=16)
    live = LiveServer(build_app(engine))
    yield engine, live
    live.stop()
    engine.close()


async def _complete(
    client: httpx.AsyncClient,
    prompt: str,
    seed: int,
    max_tokens: int,
    drop_after: int | None = None,
) -> tuple[str, int, str | None]:
    body = {
        "model": "default_model",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.8,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, tokens, finish, chunks = "", 0, None, 0
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices", []):
                text += choice.get("text", "")
                finish = choice.get("finish_reason") or finish
            chunks += 1
            if drop_after is not None and chunks >= drop_after:
                return text, -1, None  # the client walks away mid-reply
    return text, tokens, finish


async def _load(url: str, seconds: float, clients: int) -> list[tuple[int, int, str, int, str]]:
    done: list[tuple[int, int, str, int, str]] = []
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

        async def worker(w: int) -> None:
            i = 0
            while time.monotonic() < stop:
                p, seed = (w + i) % len(PROMPTS), 1000 + (w * 7 + i) % 5
                drop = 2 if (w + i) % 9 == 4 else None
                text, tokens, finish = await _complete(client, PROMPTS[p], seed, 12, drop)
                if tokens >= 0:
                    done.append((p, seed, text, tokens, finish))
                i += 1

        await asyncio.gather(*(worker(w) for w in range(clients)))
    return done


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+-]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _run(server, seconds: float) -> None:
    engine, live = server
    before = httpx.get(f"{live.url}/metrics").text
    done = asyncio.run(_load(live.url, seconds, clients=64))
    assert done, "no reply completed"
    assert all(finish in ("length", "stop") for *_, finish in done)
    alone = {}
    with httpx.Client(base_url=live.url, timeout=120) as client:
        for p, seed in sorted({(p, s) for p, s, *_ in done}):
            r = client.post(
                "/v1/completions",
                json={
                    "model": "default_model",
                    "prompt": PROMPTS[p],
                    "max_tokens": 12,
                    "temperature": 0.8,
                    "seed": seed,
                },
            )
            alone[(p, seed)] = r.json()["choices"][0]["text"]
    assert all(text == alone[(p, seed)] for p, seed, text, _, _ in done)
    deadline = time.monotonic() + 10
    while engine.stats()["sessions_busy"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.stats()["sessions_busy"] == 0  # dropped clients freed their sessions
    after = httpx.get(f"{live.url}/metrics").text
    served = _metric(after, "flashlane_generation_tokens_total") - _metric(
        before, "flashlane_generation_tokens_total"
    )
    # completed replies plus the partial ones of clients that left, plus the alone replies
    assert served >= sum(t for *_, t, _ in done)
    finished = _finished(after) - _finished(before)
    assert finished == len(done) + len(alone)  # every complete reply counted once


def _finished(text: str) -> float:
    pattern = r'^flashlane_request_success_total\{finished_reason="(?:length|stop)"\} (\S+)$'
    return sum(float(v) for v in re.findall(pattern, text, re.M))


def test_64_streaming_clients_for_10_seconds(server):
    _run(server, 10.0)


@pytest.mark.slow
def test_64_streaming_clients_for_60_seconds(server):
    _run(server, 60.0)
