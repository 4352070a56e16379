"""bench serve against the live fake server: a table, one JSON line, and --check-alone;
prompts tokenized by the client, and a dropped or stalled stream an error, not a hang."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time

import httpx
import pytest

from flashlane.bench.client import send
from flashlane.bench.serve import bench_serve_main
from flashlane.server.api import build_app
from tests.server.conftest import LiveServer


@pytest.fixture
def tok_file(tokenizer, tmp_path) -> str:
    """The fake engine's tokenizer as a file: the client tokenizes with the server's model."""
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def test_bench_serve_levels_and_check_alone(live, capsys, tmp_path, tok_file):
    out = tmp_path / "bench.json"
    argv = [
        "--tokenizer",
        tok_file,
        "--url",
        live.url,
        "--concurrency",
        "1,4",
        "--num-prompts",
        "6",
        "--input-len",
        "12",
        "--output-len",
        "5",
        "--seed",
        "3",
        "--check-alone",
        "--output-json",
        str(out),
    ]
    assert bench_serve_main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert json.loads(out.read_text()) == result
    assert [r["concurrency"] for r in result["levels"]] == [1, 4]
    for row in result["levels"]:
        assert (row["completed"], row["errors"], row["alone_mismatches"]) == (6, 0, 0)
        assert row["output_tokens"] == 30 and row["output_tok_s"] > 0
        assert row["ttft_ms"]["median"] > 0 and row["tpot_ms"]["median"] >= 0
    assert lines[0].split()[:3] == ["conc", "ok", "err"]


def test_bench_serve_reports_errors(live, capsys, tok_file):
    argv = [
        "--tokenizer",
        tok_file,
        "--url",
        live.url,
        "--concurrency",
        "2",
        "--num-prompts",
        "2",
        "--input-len",
        "4",
        "--output-len",
        "5000",
        "--warmup",
        "0",
    ]
    assert bench_serve_main(argv) == 1
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["levels"][0]["errors"] == 2


def test_64_concurrent_streams_equal_alone_and_metrics_agree(serve, tokenizer, capsys, tok_file):
    """The short load test: 64 streaming clients, every reply equal to its alone reply."""
    from tests.server.fake_engine import FakeEngine

    live = serve(FakeEngine(tokenizer=tokenizer, delay=0.001))
    argv = [
        "--tokenizer",
        tok_file,
        "--url",
        live.url,
        "--concurrency",
        "64",
        "--num-prompts",
        "64",
        "--input-len",
        "16",
        "--output-len",
        "8",
        "--seed",
        "9",
        "--check-alone",
        "--warmup",
        "0",
    ]
    assert bench_serve_main(argv) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["levels"][0]
    assert (row["completed"], row["errors"], row["alone_mismatches"]) == (64, 0, 0)
    metrics = httpx.get(f"{live.url}/metrics").text
    served = 2 * 64 * 8  # the alone pass and the concurrent pass, 8 tokens each
    assert f"flashlane_generation_tokens_total {served}.0" in metrics
    assert 'flashlane_request_success_total{finished_reason="length"} 128.0' in metrics
    assert "flashlane_replies_in_flight 0.0" in metrics


def test_prompts_are_tokenized_by_the_client(engine, tok_file, capsys):
    """A server without /tokenize (llama-server's asks for other fields) is measured all the
    same: the client cuts the prompts with the served model's tokenizer."""
    app = build_app(engine)
    app.router.routes = [r for r in app.router.routes if getattr(r, "path", "") != "/tokenize"]
    live = LiveServer(app)
    try:
        assert httpx.post(f"{live.url}/tokenize", json={"prompt": "a"}).status_code == 404
        argv = [
            "--url",
            live.url,
            "--tokenizer",
            tok_file,
            "--concurrency",
            "2",
            "--num-prompts",
            "2",
            "--input-len",
            "12",
            "--output-len",
            "3",
            "--warmup",
            "0",
        ]
        assert bench_serve_main(argv) == 0
    finally:
        live.stop()
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["levels"][0]
    assert (row["completed"], row["errors"], row["output_tokens"]) == (2, 0, 6)


CHUNK = b'data: {"choices": [{"text": "hi"}]}\n\n'
HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


# what a server does after reading the request: each must end as the request's error
ENDINGS = {
    "closed before answering": b"",
    "closed mid-stream": HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(CHUNK),
    "complete body without [DONE]": HEAD + b"content-length: %d\r\n\r\n" % len(CHUNK) + CHUNK,
    "stalled mid-stream": None,
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_dropped_or_stalled_stream_is_an_error_not_a_hang(ending):
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    release = threading.Event()

    def serve_once():
        conn, _ = sock.accept()
        conn.recv(65536)
        if ENDINGS[ending] is None:
            conn.sendall(HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(CHUNK))
            release.wait(10)  # holds the connection open, silent
        else:
            conn.sendall(ENDINGS[ending])
        conn.close()

    thread = threading.Thread(target=serve_once, daemon=True)
    thread.start()

    async def one():
        async with httpx.AsyncClient(timeout=30) as client:
            return await send(client, f"http://127.0.0.1:{port}", {"prompt": [1]}, timeout=1.0)

    t0 = time.perf_counter()
    try:
        result = asyncio.run(one())
    finally:
        release.set()
        thread.join(5)
        sock.close()
    assert not result.ok and result.error, ending
    assert time.perf_counter() - t0 < 5


def test_a_kept_alive_connection_closed_by_the_server_is_tried_again():
    """llama-server closes a kept-alive connection after a few requests: the next request on it
    fails before any answer, and goes again on a fresh connection instead of failing."""
    sock = socket.create_server(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    answer = (
        HEAD
        + b"transfer-encoding: chunked\r\n\r\n"
        + _chunked(CHUNK)
        + _chunked(b"data: [DONE]\n\n")
        + b"0\r\n\r\n"
    )

    def serve_twice():
        for reply in (b"", answer):  # the first connection closes unanswered
            conn, _ = sock.accept()
            conn.recv(65536)
            conn.sendall(reply)
            conn.close()

    thread = threading.Thread(target=serve_twice, daemon=True)
    thread.start()

    async def one():
        async with httpx.AsyncClient(timeout=30) as client:
            return await send(client, f"http://127.0.0.1:{port}", {"prompt": [1]}, timeout=5.0)

    try:
        result = asyncio.run(one())
    finally:
        thread.join(5)
        sock.close()
    assert result.ok and result.text == "hi", result.error


def test_poisson_arrivals_are_seeded_with_the_rates_mean():
    from flashlane.bench.serve import poisson_arrivals

    assert poisson_arrivals(4, float("inf"), 1) == [0.0] * 4
    times = poisson_arrivals(4000, 50.0, 7)
    assert times == poisson_arrivals(4000, 50.0, 7) and times[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0 and abs(sum(gaps) / len(gaps) - 1 / 50) < 0.002


def test_bench_serve_with_poisson_arrivals(live, capsys, tok_file):
    """At 20 requests a second, 8 requests take at least their last arrival's time."""
    from flashlane.bench.serve import poisson_arrivals

    argv = [
        "--tokenizer",
        tok_file,
        "--url",
        live.url,
        "--concurrency",
        "4",
        "--num-prompts",
        "8",
        "--input-len",
        "6",
        "--output-len",
        "3",
        "--request-rate",
        "20",
        "--seed",
        "2",
        "--check-alone",
    ]
    assert bench_serve_main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    row = result["levels"][0]
    assert result["request_rate"] == 20.0
    assert (row["completed"], row["errors"], row["alone_mismatches"]) == (8, 0, 0)
    assert row["duration_s"] >= poisson_arrivals(8, 20.0, 2)[-1]


def test_differs_says_where_a_reply_parts_from_alone():
    from flashlane.bench.client import Result, compared
    from flashlane.bench.serve import differs

    alone = Result(ok=True, token_ids=[5, 6, 7, 8])
    assert differs(3, Result(ok=True, token_ids=[5, 6, 7, 8]), compared(alone)) is None
    got = differs(3, Result(ok=True, token_ids=[5, 6, 9, 8, 1]), compared(alone))
    assert got == {"prompt": 3, "first": 2, "len": 5, "alone_len": 4}
    short = differs(0, Result(ok=True, token_ids=[5, 6]), compared(alone))
    assert short == {"prompt": 0, "first": 2, "len": 2, "alone_len": 4}
    failed = differs(1, Result(ok=False, error="timeout"), compared(alone))
    assert failed == {"prompt": 1, "error": "timeout"}


def test_bench_serve_waits_for_a_server_still_loading():
    """/v1/models says 503 while the model loads: bench serve asks again until it lists a
    model, and past --ready-check-timeout-sec stops with what the server said."""
    from flashlane.bench.serve import build_parser, served_model

    answers = iter([503, 503, 200])

    def loading(request: httpx.Request) -> httpx.Response:
        code = next(answers, 200)
        body = {"data": [{"id": "m"}]} if code == 200 else {"error": {"message": "loading"}}
        return httpx.Response(code, json=body)

    def never(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, json={"error": {"message": "loading"}})

    async def ask(handler, *flags):
        args = build_parser().parse_args(["--url", "http://x", *flags])
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            return await served_model(client, args)

    t0 = time.monotonic()
    assert asyncio.run(ask(loading)) == "m"
    assert time.monotonic() - t0 >= 1.5  # asked three times, a second apart
    with pytest.raises(SystemExit, match=r"not ready within 0.2 s \(/v1/models: HTTP 503\)"):
        asyncio.run(ask(never, "--ready-check-timeout-sec", "0.2"))
    assert asyncio.run(ask(never, "--model", "given")) == "given"


def test_extra_body_adds_fields_to_every_request(capsys):
    from flashlane.bench.serve import build_parser, request_body

    p = build_parser()
    args = p.parse_args(["--seed", "4", "--extra-body", '{"frequency_penalty": 0.5, "top_p": 0.9}'])
    body = request_body(args, "m", [1, 2], 3)
    assert (body["seed"], body["frequency_penalty"], body["top_p"]) == (7, 0.5, 0.9)
    assert "frequency_penalty" not in request_body(p.parse_args([]), "m", [1], 0)
    for bad, why in (("{oops", "not JSON"), ("[1]", "must be a JSON object")):
        with pytest.raises(SystemExit):
            p.parse_args(["--extra-body", bad])
        assert why in capsys.readouterr().err
