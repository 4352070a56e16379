"""The prompt cache over HTTP on the real engine: a resent prompt reports its cached tokens in
the usage and the same reply; /metrics counts the cache's queries, hits and kept bytes; a chat
branching from another at a message boundary resumes there, with the reply it gets without."""

from __future__ import annotations

import shutil

import httpx
import torch

from flashlane.lanes.records import CostTable
from flashlane.server import chat_endpoint
from flashlane.server.api import build_app
from flashlane.server.chat import ChatTemplate
from flashlane.server.engine_thread import AsyncEngine
from tests.server.conftest import LiveServer
from tests.server.fake_engine import TEMPLATE, build_tokenizer
from tests.server.test_chat_marks import SYSTEM
from tests.server.test_ops import metric

COSTS = CostTable({1: 1.0, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)


def test_resent_completion_reports_cached_tokens_and_metrics(tiny_ckpt):
    engine = AsyncEngine(str(tiny_ckpt), costs=COSTS, parallel=2)
    live = LiveServer(build_app(engine))
    try:
        prompt = torch.randint(3, 500, (200,), generator=torch.Generator().manual_seed(3))
        body = {"prompt": prompt.tolist(), "max_tokens": 8, "temperature": 0.7, "seed": 5}
        replies = [
            httpx.post(f"{live.url}/v1/completions", json=body, timeout=60).json() for _ in range(2)
        ]
        cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in replies]
        assert cached == [0, 192]
        assert replies[0]["choices"][0]["text"] == replies[1]["choices"][0]["text"]
        text = httpx.get(f"{live.url}/metrics").text
        assert metric(text, "flashlane_prompt_cache_queries_total") == 2
        assert metric(text, "flashlane_prompt_cache_hits_total") == 1
        assert metric(text, "flashlane_prompt_cache_hit_tokens_total") == 192
        assert metric(text, "flashlane_prompt_cache_bytes") > 0
        assert metric(text, "flashlane_prompt_cached_tokens_total") == 192
    finally:
        live.stop()
        engine.close()


def chat_ckpt(tiny_ckpt, folder):
    """The tiny checkpoint with the fake engine's tokenizer (404 ids) and chat template."""
    shutil.copytree(tiny_ckpt, folder)
    build_tokenizer().save(str(folder / "tokenizer.json"))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


def chat_replies(ckpt, conversations: list[list[dict]]) -> list[dict]:
    """Each conversation's reply, in order, from a fresh engine and server."""
    engine = AsyncEngine(str(ckpt), costs=COSTS, parallel=2)
    live = LiveServer(build_app(engine))
    try:
        url = f"{live.url}/v1/chat/completions"
        replies = []
        for messages in conversations:
            body = {"messages": messages, "max_tokens": 8, "temperature": 0.7, "seed": 5}
            r = httpx.post(url, json=body, timeout=60)
            assert r.status_code == 200, r.text
            replies.append(r.json())
        return replies
    finally:
        live.stop()
        engine.close()


def test_chat_branching_at_a_message_resumes_there_with_the_same_reply(
    tiny_ckpt, tmp_path, monkeypatch
):
    ckpt = chat_ckpt(tiny_ckpt, tmp_path / "chat")
    head = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What is two plus two?"},
    ]
    answer = "Let me think about the question before I answer it: two plus two is four. " * 2
    first = [*head, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
    second = [*head, {"role": "assistant", "content": "Four."}, {"role": "user", "content": "Hi"}]
    marked = chat_replies(ckpt, [first, second])
    # the same requests with no boundaries: states kept only at each prompt's end mark
    monkeypatch.setattr(chat_endpoint, "message_ends", lambda *args: [])
    plain = chat_replies(ckpt, [first, second])

    tokenizer = build_tokenizer()
    text = ChatTemplate(TEMPLATE).render(head, add_generation_prompt=False)
    head_end = len(tokenizer.encode(text, add_special_tokens=False).ids)
    cached = [r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in marked + plain]
    assert head_end // 64 * 64 > 0
    assert cached == [0, head_end // 64 * 64, 0, 0]
    for with_marks, without in zip(marked, plain):
        assert with_marks["choices"] == without["choices"]
        assert with_marks["usage"]["completion_tokens"] == without["usage"]["completion_tokens"]
