"""/v1/messages (Anthropic) and /v1/responses (OpenAI Responses) on the real embedded model,
checked with the official anthropic and openai SDKs: system, content blocks, tools with
tool_use / tool_result, streamed events, stop_reason and usage; Responses text and tools,
streamed and whole."""

from __future__ import annotations

import json
from collections.abc import Iterator

import anthropic
import httpx
import jsonschema
import pytest

from tests.server.conftest import LiveServer, embedded_server

MODEL = "default_model"
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Weather.", "input_schema": WEATHER_SCHEMA}
NO_THINKING = {"type": "disabled"}


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    with embedded_server(api_keys=["sk-test"]) as server:
        yield server


def claude(live) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="sk-test", max_retries=0)


def test_messages_whole_reply(live):
    m = claude(live).messages.create(
        model=MODEL,
        max_tokens=12,
        system="You write Python.",
        messages=[{"role": "user", "content": [{"type": "text", "text": "def main():"}]}],
        thinking=NO_THINKING,
        extra_body={"temperature": 0.0},
    )
    assert m.type == "message" and m.role == "assistant"
    assert m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.input_tokens > 10 and 0 < m.usage.output_tokens <= 12
    assert [b.type for b in m.content] == ["text"] and m.content[0].text


def test_messages_stream_a_forced_tool_use_and_take_its_result(live):
    client = claude(live)
    with client.messages.stream(
        model=MODEL,
        max_tokens=80,
        messages=[{"role": "user", "content": "Weather in Lima for 3 days?"}],
        tools=[ANTHROPIC_TOOL],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        extra_body={"seed": 3, "temperature": 0.7},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "input_json" in kinds
    assert final.stop_reason == "tool_use"
    (use,) = [b for b in final.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER_SCHEMA)
    follow = client.messages.create(
        model=MODEL,
        max_tokens=8,
        messages=[
            {"role": "user", "content": "Weather in Lima for 3 days?"},
            {"role": "assistant", "content": final.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 24C"},
                    {"type": "text", "text": "Summarise."},
                ],
            },
        ],
        tools=[ANTHROPIC_TOOL],
    )
    assert follow.usage.input_tokens > final.usage.input_tokens


def test_messages_errors_have_anthropic_shape(live):
    with pytest.raises(anthropic.BadRequestError) as err:
        claude(live).messages.create(
            model=MODEL, max_tokens=4,
            messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}],
        )  # fmt: skip
    assert err.value.body["type"] == "error"
    assert "image" in err.value.body["error"]["message"]


def test_responses_stream_text(live):
    client = live.client(api_key="sk-test")
    quiet = {"chat_template_kwargs": {"enable_thinking": False}}
    events = list(client.responses.create(
        model=MODEL, input="import os\n", instructions="Write Python.", max_output_tokens=10,
        temperature=0.0, stream=True, extra_body=quiet,
    ))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    whole = client.responses.create(
        model=MODEL, input="import os\n", instructions="Write Python.", max_output_tokens=10,
        temperature=0.0, extra_body=quiet,
    )  # fmt: skip
    assert streamed and streamed == whole.output_text == events[-1].response.output_text
    assert whole.usage.output_tokens == 10 and whole.status == "incomplete"


def test_responses_tools_and_function_call_output(live):
    client = live.client(api_key="sk-test")
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER_SCHEMA}
    r = client.responses.create(
        model=MODEL, input="Weather in Oslo?", tools=[tool], tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=80, extra_body={"seed": 2},
    )  # fmt: skip
    (call,) = [item for item in r.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    again = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Oslo?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "cold"},
        ],
        tools=[tool],
        max_output_tokens=6,
    )
    assert again.usage.input_tokens > r.usage.input_tokens
    stale = httpx.post(
        f"{live.url}/v1/responses",
        json={"input": "x", "previous_response_id": "resp_1"},
        headers={"authorization": "Bearer sk-test"},
    )
    assert stale.status_code == 400 and "stateless" in stale.json()["error"]["message"]
