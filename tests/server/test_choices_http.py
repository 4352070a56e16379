"""n > 1 on the real embedded model with the official openai client: choice j of a seeded
request equals a single request seeded (seed + j) mod 2**63, streamed or not, and the choices
after the first resume the prompt's prefill from the prompt cache."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server.conftest import LiveServer, embedded_server
from tests.server.test_ops import metric

MODEL = "default_model"
# long enough (over 64 tokens) for the prompt cache to keep a state the choices share
LONG = "Explain what this does:\n" + "".join(f"x{i} = os.path.join(a, b{i})\n" for i in range(12))


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    with embedded_server() as server:
        yield server


def said(message):
    """A choice's text and reasoning (the embedded model's chats start with thinking off)."""
    return message.content, getattr(message, "reasoning_content", None)


def chat(live, seed, n=1, **kw):
    return live.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": LONG}],
        max_tokens=12,
        temperature=0.9,
        seed=seed,
        n=n,
        **kw,
    )


def test_chat_choices_equal_their_single_request_twins(live):
    before = metric(httpx.get(f"{live.url}/metrics").text, "flashlane_prompt_cache_hits_total")
    r = chat(live, 41, n=3)
    after = metric(httpx.get(f"{live.url}/metrics").text, "flashlane_prompt_cache_hits_total")
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert after - before >= 2  # choices 1 and 2 resumed the first one's prompt state
    for j, choice in enumerate(r.choices):
        twin = chat(live, 41 + j).choices[0]
        assert said(choice.message) == said(twin.message)
    assert len({said(c.message) for c in r.choices}) > 1
    assert r.usage.completion_tokens > r.usage.prompt_tokens // 100


def test_seeds_wrap_modulo_2_63(live):
    r = chat(live, 2**63 - 1, n=2)
    twin = chat(live, 0).choices[0].message
    assert said(r.choices[1].message) == said(twin)


def test_streamed_completion_choices_equal_their_twins(live):
    client = live.client()
    body = dict(model=MODEL, prompt="import os\n", max_tokens=10, temperature=1.0)
    texts = ["", "", ""]
    for chunk in client.completions.create(**body, n=3, seed=7, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
    twins = [client.completions.create(**body, seed=7 + j).choices[0].text for j in range(3)]
    assert texts == twins
