"""bench serve against the live fake server: a table, one JSON line, and --check-alone."""

from __future__ import annotations

import json

import httpx

from flashlane.bench_serve import bench_serve_main


def test_bench_serve_levels_and_check_alone(live, capsys, tmp_path):
    out = tmp_path / "bench.json"
    argv = [
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


def test_bench_serve_reports_errors(live, capsys):
    argv = [
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


def test_64_concurrent_streams_equal_alone_and_metrics_agree(serve, tokenizer, capsys):
    """The short load test: 64 streaming clients, every reply equal to its alone reply."""
    from tests.server.fake_engine import FakeEngine

    live = serve(FakeEngine(tokenizer=tokenizer, delay=0.001))
    argv = [
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
