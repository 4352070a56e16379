"""A live server on loopback: uvicorn on a thread, driven with the official openai client."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import uvicorn
from openai import OpenAI

from flashlane.lanes.records import CostTable
from flashlane.server.api import build_app
from tests.server.fake_engine import FakeEngine, build_tokenizer


class LiveServer:
    """Serves `app` on 127.0.0.1 at a free port until stop()."""

    def __init__(self, app) -> None:
        self.app = app
        # IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say so (no Nagle stalls)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    def client(self, api_key: str = "none", **kw) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)
        self._sock.close()


@pytest.fixture(scope="module")
def real_server():
    """The real engine (embedded model, 2 sessions of 1024 positions) behind a live server."""
    from flashlane.lanes.records import CostTable
    from flashlane.server.engine_thread import AsyncEngine

    costs = CostTable({1: 10.0, 8: 14.0, 16: 20.0}, draft_step_ms=3.0, overhead_ms=1.0)
    engine = AsyncEngine(costs=costs, parallel=2, context=1024)
    live = LiveServer(build_app(engine))
    yield engine, live
    live.stop()
    engine.close()


@pytest.fixture(scope="session")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def shared(tokenizer) -> Iterator[tuple[FakeEngine, LiveServer]]:
    """One server per module (starting and stopping one costs ~0.2 s); tests reset its engine."""
    engine = FakeEngine(tokenizer=tokenizer)
    server = LiveServer(build_app(engine))
    yield engine, server
    server.stop()


@pytest.fixture
def engine(shared) -> FakeEngine:
    shared[0].reset()
    return shared[0]


@pytest.fixture
def live(shared, engine) -> LiveServer:
    return shared[1]


@pytest.fixture
def serve() -> Iterator:
    """serve(engine, **build_app kwargs) -> a fresh LiveServer, stopped after the test."""
    servers: list[LiveServer] = []

    def start(engine, **kw) -> LiveServer:
        servers.append(LiveServer(build_app(engine, **kw)))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


# prices fixed so that no engine in these tests times anything
EMBEDDED_COSTS = CostTable({1: 1.0, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)


@contextmanager
def embedded_server(**app_options) -> Iterator[LiveServer]:
    """A live server over the real embedded model (4 sessions); app_options go to build_app."""
    from flashlane.server.engine_thread import AsyncEngine

    engine = AsyncEngine(None, costs=EMBEDDED_COSTS, parallel=4)
    server = LiveServer(build_app(engine, **app_options))
    try:
        yield server
    finally:
        server.stop()
        engine.close()
