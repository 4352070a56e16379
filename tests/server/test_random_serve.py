"""`flashlane serve --config NAME --random-weights` (a benchmark's model, built in memory with
the embedded tokenizer) and completions' `return_token_ids` (vLLM's): a reply's ids, whole
and streamed, where its text cannot show them; bench serve compares replies by them."""

from __future__ import annotations

import json

import httpx
import pytest

from flashlane.bench.serve import bench_serve_main
from flashlane.cli import _check_random, build_parser, main
from flashlane.server.api import build_app
from flashlane.server.engine_thread import start_engine
from tests.server.conftest import LiveServer

FLAGS = [
    "serve",
    "--config",
    "flashnext-tiny",
    "--random-weights",
    "--device",
    "cpu",
    "--parallel",
    "2",
    "--context",
    "256",
]


@pytest.fixture(scope="module")
def random_server():
    args = build_parser().parse_args(FLAGS)
    _check_random(args)
    engine = start_engine(args)
    live = LiveServer(build_app(engine))
    yield engine, live
    live.stop()
    engine.close()


def test_random_weights_serve_token_ids_whole_and_streamed(random_server):
    engine, live = random_server
    assert engine.model_name == "flashnext-tiny-random" and engine.tokenizer is not None
    body = {
        "model": engine.model_name,
        "prompt": [5, 17, 300, 9],
        "max_tokens": 6,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    whole = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60).json()
    choice = whole["choices"][0]
    assert choice["prompt_token_ids"] == [5, 17, 300, 9]
    assert len(choice["token_ids"]) == 6 == whole["usage"]["completion_tokens"]
    got, prompt_ids = [], None
    with httpx.stream(
        "POST", f"{live.url}/v1/completions", json={**body, "stream": True}, timeout=60
    ) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    got += c["token_ids"]
                    prompt_ids = c.get("prompt_token_ids", prompt_ids)
    assert got == choice["token_ids"] and prompt_ids == [5, 17, 300, 9]
    # without the field, no ids in the reply (OpenAI's shape)
    plain = httpx.post(
        f"{live.url}/v1/completions", json={**body, "return_token_ids": False}, timeout=60
    ).json()
    assert "token_ids" not in plain["choices"][0]


def test_prompt_ids_past_the_models_rows_are_a_400(random_server):
    """flashnext-tiny embeds 512 ids, the embedded tokenizer has 8,192 words."""
    engine, live = random_server
    body = {"model": engine.model_name, "prompt": [5, 600], "max_tokens": 2}
    r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=60)
    assert r.status_code == 400 and "prompt" in r.text
    ok = httpx.post(f"{live.url}/v1/completions", json={**body, "prompt": [5, 511]}, timeout=60)
    assert ok.status_code == 200  # and the engine serves on


def test_bench_serve_checks_replies_by_their_ids(tmp_path, capsys):
    """A config with the tokenizer's 8,192 ids (bench serve's prompts are words), sampled."""
    from flashlane.models.presets import preset

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**preset("flashnext-tiny"), "vocab_size": 8192}))
    args = build_parser().parse_args([*FLAGS[:2], str(config), *FLAGS[3:]])
    _check_random(args)
    engine = start_engine(args)
    live = LiveServer(build_app(engine))
    try:
        argv = [
            "--url",
            live.url,
            "--concurrency",
            "1,2",
            "--num-prompts",
            "3",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--seed",
            "1",
            "--check-alone",
        ]
        assert bench_serve_main(argv) == 0
    finally:
        live.stop()
        engine.close()
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for row in result["levels"]:
        assert (row["completed"], row["errors"], row["alone_mismatches"]) == (3, 0, 0)
        assert row["output_tokens"] == 12


@pytest.mark.parametrize(
    "extra,why",
    [
        ([], "needs --config"),
        (["--config", "no-such-preset"], "no such preset"),
        (["--config", "flashnext-tiny", "--model", "x"], "give no model"),
    ],
)
def test_random_weights_bad_flags_are_one_line(extra, why, capsys):
    assert main(["serve", "--random-weights", "--device", "cpu", *extra]) == 2
    assert why in capsys.readouterr().err
