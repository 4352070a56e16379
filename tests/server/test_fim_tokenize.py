"""/tokenize takes llama.cpp's `content` as well as `prompt`; /v1/completions `suffix` builds a
fill-in-the-middle prompt where the tokenizer defines the FIM tokens, else a clear 400."""

from __future__ import annotations

import httpx
import openai
import pytest

from flashlane.server.completion_endpoint import FIM_TOKENS
from tests.server.fake_engine import FakeEngine, build_tokenizer


def test_tokenize_takes_content_like_llama_cpp(live, engine):
    by_prompt = httpx.post(f"{live.url}/tokenize", json={"prompt": "hello world"}).json()
    by_content = httpx.post(f"{live.url}/tokenize", json={"content": "hello world"}).json()
    assert by_content["tokens"] == by_prompt["tokens"] == engine.tokenizer.encode("hello world").ids
    both = httpx.post(f"{live.url}/tokenize", json={"content": "a", "prompt": "b"})
    assert both.status_code == 400 and both.json()["error"]["param"] == "prompt"


def test_suffix_without_fim_tokens_is_a_clear_400(live):
    with pytest.raises(openai.BadRequestError) as err:
        live.client().completions.create(model="fake-flash", prompt="def f(", suffix="\n")
    assert err.value.body["param"] == "suffix"
    assert "<|fim_prefix|>" in err.value.body["message"]


def test_suffix_makes_a_prefix_suffix_middle_prompt(serve):
    tokenizer = build_tokenizer()
    tokenizer.add_special_tokens(list(FIM_TOKENS))
    engine = FakeEngine(tokenizer=tokenizer)
    live = serve(engine)
    live.client().completions.create(
        model="fake-flash", prompt="def add(a, b):\n", suffix="\n    return c\n", max_tokens=4
    )
    prompt = tokenizer.decode(engine.started[-1][1], skip_special_tokens=False)
    assert prompt == "<|fim_prefix|>def add(a, b):\n<|fim_suffix|>\n    return c\n<|fim_middle|>"
