"""The shipped tokenizer: special ids, round trips, and files that agree with each other."""

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from training import tokenizer as tk

MODEL_DIR = Path(__file__).parents[2] / "flashlane" / "default_model"


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def test_size_and_special_ids(tok):
    assert tok.get_vocab_size() == tk.VOCAB_SIZE == 8192
    tk.check_special_ids(tok)
    assert tok.token_to_id("<|endoftext|>") == 0
    assert tok.token_to_id("<|im_start|>") == 1
    assert tok.token_to_id("<|im_end|>") == 2
    assert tok.token_to_id("<think>") == 3 and tok.token_to_id("</think>") == 4
    assert tok.token_to_id("<tool_call>") == 5 and tok.token_to_id("</tool_response>") == 8


@pytest.mark.parametrize(
    "text",
    [
        'def fibonacci(n):\n    """Return the nth Fibonacci number."""\n    return n\n',
        "\t\tx = {'a': [1, 2.5e-3]}  # comment\r\n\n\n",
        "unicode: héllo wörld 日本語 🐍 — ok",
        "",
        " leading space and trailing   ",
    ],
)
def test_round_trip(tok, text):
    ids = tok.encode(text).ids
    assert tok.decode(ids, skip_special_tokens=False) == text


def test_special_tokens_inside_text(tok):
    text = "<|im_start|>user\nhi<|im_end|>\n<think>\nplan\n</think>\n\n<tool_call>x</tool_call>"
    ids = tok.encode(text).ids
    assert ids[0] == 1 and 2 in ids and 3 in ids and 4 in ids and 5 in ids and 6 in ids
    assert tok.decode(ids, skip_special_tokens=False) == text
    # Reasoning and tool tags are not special: they survive skip_special_tokens.
    kept = tok.decode(ids, skip_special_tokens=True)
    assert "<|im_start|>" not in kept and "<think>" in kept and "<tool_call>" in kept


def test_training_is_deterministic_and_places_specials():
    docs = ["def f(x):\n    return x + 1\n"] * 20 + ["class A:\n    pass\n"] * 10
    a = tk.train_tokenizer(docs, vocab_size=300)
    b = tk.train_tokenizer(docs, vocab_size=300)
    assert a.to_str() == b.to_str()
    tk.check_special_ids(a)


def test_shipped_files_agree():
    template = (MODEL_DIR / "chat_template.jinja").read_text()
    assert template == tk.chat_template()
    config = json.loads((MODEL_DIR / "tokenizer_config.json").read_text())
    assert config["chat_template"] == template
    assert config["eos_token"] == "<|endoftext|>"
    decoder = config["added_tokens_decoder"]
    assert {int(i): d["content"] for i, d in decoder.items()} == dict(
        enumerate(t for t, _ in tk.SPECIAL_TOKENS)
    )
    generation = json.loads((MODEL_DIR / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [2, 0]
    assert 0 < generation["temperature"] <= 1 and 0 < generation["top_p"] <= 1
