"""Issue 30's hostile list, one test per repro (items 1, 4, 5, 6 and the HTTP parts of 7; the
20 MB stall is test_stall.py, item 3 test_budget.py, item 2 and the drain test_faults.py, the
options of item 7 tests/test_cli_options.py). None of them may be a 500."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket

import httpx
import pytest

from flashlane.server.guard import allowed_hosts
from flashlane.server.transport import ClientGone, until_disconnect
from tests.server.fake_engine import FakeEngine
from tests.server.test_ops import metric, wait_for

USER = [{"role": "user", "content": "hi"}]
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"


def post(live, path, body=None, **kw):
    return httpx.post(f"{live.url}{path}", json=body, **kw)


def error_of(response, status):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def raw(live, data: bytes) -> socket.socket:
    host, port = live.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(data)
    return sock


def request_bytes(path: str, body: bytes, content_type: str = "application/json") -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
    return (head + f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one response with a Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


# -- 1: every route that runs the tokenizer or the template needs the key; prompts are capped


def test_1_tokenizer_routes_need_the_key(serve, engine):
    live = serve(engine, api_keys=["k"], metrics_keys=["m"])
    for path, body in [("/tokenize", {"prompt": "hi"}), ("/detokenize", {"tokens": [1]})]:
        assert error_of(post(live, path, body), 401)["code"] == "invalid_api_key"
        ok = post(live, path, body, headers={"Authorization": "Bearer k"})
        assert ok.status_code == 200
    assert httpx.get(f"{live.url}/metrics").status_code == 401
    assert (
        httpx.get(f"{live.url}/metrics", headers={"Authorization": "Bearer k"}).status_code == 401
    )
    assert (
        httpx.get(f"{live.url}/metrics", headers={"Authorization": "Bearer m"}).status_code == 200
    )
    assert httpx.get(f"{live.url}/health").status_code == 200
    assert error_of(httpx.get(f"{live.url}/v1/nothing"), 401)["code"] == "invalid_api_key"


def test_1_a_prompt_longer_than_the_context_can_hold_is_not_tokenized(live, engine, monkeypatch):
    state = live.app.state.flashlane
    calls = []
    monkeypatch.setattr(engine.tokenizer.__class__, "encode_batch", lambda *a, **k: calls.append(1))
    text = "x" * (engine.context_len * state.longest_token_chars + 1)
    for path, body in [
        (COMPLETIONS, {"prompt": text}),
        (CHAT, {"messages": [{"role": "user", "content": text}]}),
        ("/tokenize", {"prompt": text}),
    ]:
        assert error_of(post(live, path, body), 400)["code"] == "context_length_exceeded"
    assert calls == [] and engine.started == []


# -- 4: client input that was a 500


HOSTILE = [
    (CHAT, b'{"messages": ' + b"[" * 10000 + b"]" * 10000 + b"}", None),
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\udfffb"}]}', None),
    (COMPLETIONS, b'{"prompt": "\\udfff"}', None),
    (COMPLETIONS, b'{"prompt": "hi", "stop": ["\\ud800"]}', None),
    (CHAT, b'{"messages": [{"role": "user", "content": "hi"}], "temperature": NaN}', None),
]
KWARGS = ["eos_token", "bos_token", "namespace", "messages", "raise_exception"]


@pytest.mark.parametrize(("path", "body", "param"), HOSTILE)
def test_4_hostile_bodies_are_400(live, engine, path, body, param):
    error = error_of(
        post(live, path, content=body, headers={"Content-Type": "application/json"}), 400
    )
    assert error["param"] == param
    assert engine.started == []


@pytest.mark.parametrize("name", KWARGS)
def test_4_reserved_template_kwargs_are_400(live, engine, name):
    body = {"messages": USER, "chat_template_kwargs": {name: "x"}}
    assert error_of(post(live, CHAT, body), 400)["param"] == "chat_template_kwargs"
    assert engine.started == []


@pytest.mark.parametrize("value", [5e-324, 0.0, -1.0, 1e300])
def test_4_repetition_penalty_out_of_range_is_400(live, engine, value):
    body = {"messages": USER, "repetition_penalty": value}
    assert error_of(post(live, CHAT, body), 400)["param"] == "repetition_penalty"


def test_4_the_connection_stays_up_after_a_500(serve, tokenizer):
    class Broken(FakeEngine):
        def stream(self, prompt_ids, params, request_id, boundaries=()):
            raise RuntimeError("a bug")

    live = serve(Broken(tokenizer=tokenizer))
    sock = raw(live, request_bytes(COMPLETIONS, b'{"prompt": "hi", "max_tokens": 2}'))
    head, body = read_response(sock)
    assert head.startswith(b"HTTP/1.1 500") and b"a bug" in body
    assert b"connection: close" not in head.lower()
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    head, body = read_response(sock)
    assert head.startswith(b"HTTP/1.1 200")
    sock.close()


def test_4_a_body_left_unread_says_connection_close(serve, engine):
    live = serve(engine, max_body_bytes=100)
    r = post(
        live,
        COMPLETIONS,
        content=b"{" + b" " * 200 + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 413 and r.headers["connection"] == "close"
    r = post(live, COMPLETIONS, {"prompt": "hi"}, headers={"Content-Type": "text/plain"})
    assert r.status_code == 415 and r.headers["connection"] == "close"


# -- 5: a client gone while its body is read is not a 500


def test_5_a_client_that_leaves_mid_body_is_no_500(serve, engine, caplog):
    live = serve(engine)
    caplog.set_level(logging.ERROR)
    for _ in range(5):
        head = request_bytes(COMPLETIONS, b"x" * 1000)[:-990]  # headers and 10 of 1000 bytes
        raw(live, head).close()

    def counted() -> float:
        text = httpx.get(f"{live.url}/metrics").text
        try:
            return metric(
                text, 'flashlane_http_requests_total{route="/v1/completions",status="499"}'
            )
        except KeyError:
            return 0

    wait_for(lambda: counted() == 5)
    assert 'status="500"' not in httpx.get(f"{live.url}/metrics").text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# -- 6: not reachable from a web page


def test_6_only_json_bodies(live, engine):
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        r = post(
            live,
            CHAT,
            content=b'{"messages": [{"role": "user", "content": "hi"}]}',
            headers={"Content-Type": kind},
        )
        assert error_of(r, 415)["code"] == "unsupported_media_type"
    assert post(live, CHAT, content=b"{}").status_code == 415  # no Content-Type
    ok = {"Content-Type": "application/json; charset=utf-8"}
    assert (
        post(
            live,
            CHAT,
            content=b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
            headers=ok,
        ).status_code
        == 200
    )


def test_6_the_host_header_must_name_the_bind_address(serve, engine):
    live = serve(engine, allowed_hosts=allowed_hosts("127.0.0.1"))
    port = live.url.rsplit(":", 1)[1]
    assert (
        error_of(httpx.get(f"{live.url}/health", headers={"Host": f"evil.example:{port}"}), 400)[
            "code"
        ]
        == "invalid_host"
    )
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "[::1]"):
        assert httpx.get(f"{live.url}/health", headers={"Host": host}).status_code == 200
    assert allowed_hosts("0.0.0.0") is None and allowed_hosts("127.0.0.1", ["*"]) is None
    assert allowed_hosts("10.0.0.5") == {"10.0.0.5"}
    assert allowed_hosts("127.0.0.1", ["a.example,b.example"]) == {"a.example", "b.example"}


def test_6_cors_only_for_allowed_origins(serve, engine):
    closed = serve(engine)
    r = httpx.get(f"{closed.url}/v1/models", headers={"Origin": "http://page.example"})
    assert "access-control-allow-origin" not in r.headers
    live = serve(engine, allowed_origins=["http://app.example"])
    preflight = {
        "Origin": "http://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type",
    }
    r = httpx.options(f"{live.url}{CHAT}", headers=preflight)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://app.example"
    r = httpx.get(f"{live.url}/v1/models", headers={"Origin": "http://app.example"})
    assert r.headers["access-control-allow-origin"] == "http://app.example"
    r = httpx.get(f"{live.url}/v1/models", headers={"Origin": "http://page.example"})
    assert "access-control-allow-origin" not in r.headers


# -- 7: the smaller ones


def test_7_retry_after_on_429_and_allow_on_405(serve, tokenizer):
    live = serve(FakeEngine(tokenizer=tokenizer, max_queue=0))
    r = post(live, COMPLETIONS, {"prompt": "hi"})
    assert error_of(r, 429)["code"] == "queue_full" and r.headers["retry-after"] == "1"
    r = httpx.get(f"{live.url}{COMPLETIONS}")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


@pytest.mark.parametrize("seed", [2**63, 2**70, -1])
def test_7_seeds_outside_63_bits_are_400(live, engine, seed):
    assert error_of(post(live, COMPLETIONS, {"prompt": "hi", "seed": seed}), 400)["param"] == "seed"
    r = post(live, COMPLETIONS, {"prompt": "hi", "seed": 2**63 - 1, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["seed"] == 2**63 - 1


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_7_a_dropped_reply_leaves_no_unretrieved_exception():
    """A non-streaming reply awaits its runs through a gather; a client gone meanwhile cancels
    it, and the gather's CancelledError must still be retrieved (asyncio logs it otherwise)."""

    class Gone:
        async def receive(self) -> dict:
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

    async def drop() -> None:
        forever = [asyncio.sleep(60), asyncio.sleep(60)]
        with pytest.raises(ClientGone):
            await until_disconnect(Gone(), asyncio.gather(*forever))  # type: ignore[arg-type]
        await asyncio.sleep(0.01)  # the children's cancellation reaches the gather

    records = _Records()
    logging.getLogger("asyncio").addHandler(records)
    try:
        asyncio.run(drop())
        gc.collect()
    finally:
        logging.getLogger("asyncio").removeHandler(records)
    assert not [m for m in records.messages if "never retrieved" in m]
