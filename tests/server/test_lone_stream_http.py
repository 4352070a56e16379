"""A served reply decoded by the lone driver reaches the client as its tokens land, not only
when a lone call ends (lanes/lone_turn.STREAM_EVERY; the server's engine sets
LaneHost.on_updates): the embedded model on the CPU, the driver turned on as the GPU runs it."""

from __future__ import annotations

import dataclasses

import pytest

from flashlane.lanes import lone_turn
from flashlane.runner.lone import LoneDriver
from flashlane.server.api import build_app
from tests.server.conftest import EMBEDDED_COSTS, LiveServer

TOKENS = 40


@pytest.fixture(scope="module")
def lone_server():
    from flashlane.server.engine_thread import AsyncEngine

    engine = AsyncEngine(None, costs=EMBEDDED_COSTS, parallel=4)
    e = engine.engine
    e.host.lone = LoneDriver(e.model, e.sessions)  # idle engine thread: no round runs now
    e.host.config = dataclasses.replace(e.host.config, lone_steps=32, lone_streams=4)
    server = LiveServer(build_app(engine))
    try:
        yield server, e.host
    finally:
        server.stop()
        engine.close()


def chunks(server, seed: int) -> tuple[list[str], int]:
    """The streamed completion's text pieces and its token count."""
    stream = server.client().completions.create(
        model="default_model", prompt="def fibonacci(n):", max_tokens=TOKENS, stream=True,
        temperature=0.8, seed=seed, extra_body={"ignore_eos": True},
        stream_options={"include_usage": True},
    )  # fmt: skip
    pieces, usage = [], None
    for c in stream:
        if c.choices:
            pieces.append(c.choices[0].text)
        usage = c.usage or usage
    return pieces, usage.completion_tokens


@pytest.mark.parametrize("every", [0.0, 1e9])
def test_lone_calls_stream_as_they_land(lone_server, monkeypatch, every):
    server, host = lone_server
    driver = host.lone
    monkeypatch.setattr(lone_turn, "STREAM_EVERY", every)
    before = driver.num_steps
    pieces, tokens = chunks(server, 3)
    assert tokens == TOKENS and driver.num_steps - before >= TOKENS - 2  # decoded lone
    assert "".join(pieces) == "".join(chunks(server, 3)[0])  # the same reply either way
    # every landed step its own chunk, or (never due) one chunk a call of up to 32 steps
    assert len(pieces) >= TOKENS - 3 if every == 0.0 else len(pieces) <= 4


def test_logprobs_and_penalties_served_lone_equal_shared_rounds(lone_server):
    """A request with logprobs and penalties on the lone driver (drawn and reported on the
    host between steps) gets the reply and logprobs shared rounds give it."""
    server, host = lone_server
    driver = host.lone

    def ask():
        c = server.client().completions.create(
            model="default_model", prompt="def fibonacci(n):", max_tokens=24, logprobs=2,
            temperature=0.7, seed=11, frequency_penalty=0.6, presence_penalty=0.3,
        ).choices[0]  # fmt: skip
        return c.text, c.logprobs.tokens, c.logprobs.token_logprobs, c.logprobs.top_logprobs

    before = driver.num_steps
    lone = ask()
    assert driver.num_steps - before >= 20  # decoded lone
    host.lone = None  # the engine thread is idle between requests
    try:
        assert ask() == lone
    finally:
        host.lone = driver
