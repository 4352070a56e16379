"""Structured output over HTTP on the real embedded model, with the official openai client:
a json_schema reply validates, a forced tool call parses with schema-valid arguments, vLLM's
guided_* extras constrain, and a bad grammar is a 400 naming its field."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import jsonschema
import openai
import pytest

from tests.server.conftest import LiveServer, embedded_server

MODEL = "default_model"
USER = [{"role": "user", "content": "Describe the module os.path as JSON."}]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "size": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"enum": ["io", "path", "text"]}, "maxItems": 3},
    },
    "required": ["name", "size", "tags"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city", "days"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "now",
        "parameters": {"type": "object", "properties": {"utc": {"type": "boolean"}}},
    },
}


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    with embedded_server() as server:
        yield server


def test_json_schema_reply_validates(live):
    client = live.client()
    fmt = {"type": "json_schema", "json_schema": {"name": "module", "schema": SCHEMA}}
    for seed in (1, 2):
        r = client.chat.completions.create(
            model=MODEL, messages=USER, response_format=fmt, seed=seed, max_tokens=80
        )
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object_mode_gives_an_object(live):
    r = live.client().chat.completions.create(
        model=MODEL,
        messages=USER,
        response_format={"type": "json_object"},
        seed=4,
        max_tokens=200,
        temperature=0.0,
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # the budget ran out inside the object: still its start
        assert r.choices[0].message.content.startswith("{")


@pytest.mark.parametrize("choice", ["required", "named"])
def test_forced_tool_call_parses_with_valid_arguments(live, choice):
    tool_choice = choice if choice == "required" else {
        "type": "function", "function": {"name": "get_weather"}
    }  # fmt: skip
    for seed in (3, 5):
        r = live.client().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Weather in Oslo for 2 days?"}],
            tools=[WEATHER, CLOCK],
            tool_choice=tool_choice,
            parallel_tool_calls=False,
            seed=seed,
            max_tokens=120,
        )
        message = r.choices[0].message
        assert r.choices[0].finish_reason == "tool_calls", message
        (call,) = message.tool_calls
        tool = {"get_weather": WEATHER, "now": CLOCK}[call.function.name]
        jsonschema.validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        if choice == "named":
            assert call.function.name == "get_weather"


def test_vllm_guided_extras(live):
    client = live.client()
    r = client.completions.create(
        model=MODEL, prompt="x = ", max_tokens=20, extra_body={"guided_regex": r"[0-9]{2,4}\.[0-9]"}
    )
    assert re.fullmatch(r"[0-9]{2,4}\.[0-9]", r.choices[0].text)
    r = client.chat.completions.create(
        model=MODEL, messages=USER, max_tokens=8,
        extra_body={"structured_outputs": {"choice": ["alpha", "beta"]}},
    )  # fmt: skip
    assert r.choices[0].message.content in ("alpha", "beta")
    gbnf = 'root ::= "yes" | "no"'  # llama.cpp's grammar format, translated
    r = client.completions.create(
        model=MODEL, prompt="ok = ", max_tokens=4, extra_body={"guided_grammar": gbnf}
    )
    assert r.choices[0].text in ("yes", "no")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_regex": "[a-"}, "guided_regex"),
        ({"guided_json": "{nope"}, "guided_json"),
        ({"guided_regex": "a", "guided_choice": ["b"]}, "guided_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ],
)
def test_bad_structured_output_is_a_400(live, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        live.client().chat.completions.create(
            model=MODEL, messages=USER, max_tokens=4, extra_body=extra
        )
    assert err.value.body["param"] == param
