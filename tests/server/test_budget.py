"""One budget rule for the engine and the HTTP layer (issue 30, item 3): the engine keeps back
a verify window past the reply's end, so what the server advertises (max_model_len) is the
largest session less that window, and every request within it is admitted."""

from __future__ import annotations

import httpx
import pytest

from flashlane.sessions.slots import check_admissible, max_model_len


@pytest.fixture(scope="module")
def small(real_server):
    return real_server


def test_max_model_len_is_always_admissible():
    for capacities, window in [((1024,), 9), ((32768,) * 4, 9), ((96, 512), 4), ((64,), 1)]:
        top = max_model_len(capacities, window)
        for prompt in (1, top // 2, top - 1):
            # the default grow margin (8192) is larger than these sessions: still admitted
            check_admissible(capacities, prompt, top - prompt, window, 8192)


def test_the_engine_advertises_what_it_admits(small):
    engine, live = small
    assert engine.context_len == 1024 - 9  # one window of 1 + 8 copy drafts kept back
    card = httpx.get(f"{live.url}/v1/models").json()["data"][0]
    assert card["max_model_len"] == engine.context_len


def first_event(live, path, body) -> tuple[int, str]:
    with httpx.stream("POST", f"{live.url}{path}", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            return r.status_code, line
    return r.status_code, ""


def test_chat_without_max_tokens_at_a_small_context(small):
    _, live = small
    body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    status, line = first_event(live, "/v1/chat/completions", body)
    assert status == 200 and line.startswith("data: ")


def test_prompts_up_to_the_last_position(small):
    engine, live = small
    top = engine.context_len
    for ids, asked in (([7] * (top - 1), None), ([7] * (top - 5), 5)):
        status, _ = first_event(live, "/v1/completions", {"prompt": ids, "max_tokens": asked})
        assert status == 200
    for ids, asked in (([7] * top, None), ([7] * 10, top)):
        body = {"prompt": ids, "max_tokens": asked}
        r = httpx.post(f"{live.url}/v1/completions", json=body)
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
