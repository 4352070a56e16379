"""Templates in the sandbox, the reasoning split and tool-call parsing, streamed and whole."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flashlane.server.chat import ChatTemplate, build_chat_prompt
from flashlane.server.protocol import ApiError, ChatRequest
from flashlane.server.reply import ReplyDelta, ReplyParser
from flashlane.server.tool_calls import convert_value, parse_tool_call
from tests.server.fake_engine import TEMPLATE

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "hours": {"type": "array"},
                "limit": {"type": ["number", "null"]},
            },
        },
    },
}
CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=metric>\ntrue\n</parameter>\n"
    "<parameter=hours>\n[1, 2]\n</parameter>\n<parameter=limit>\nnull\n</parameter>\n"
    "</function>\n</tool_call>"
)
SCHEMAS = {"get_weather": WEATHER["function"]["parameters"]}


def parse(text: str, step: int, **kw) -> tuple[ReplyDelta, list[ReplyDelta]]:
    parser = ReplyParser(**kw)
    total, parts = ReplyDelta(), []
    for i in range(0, len(text), step):
        parts.append(parser.feed(text[i : i + step]))
        total.extend(parts[-1])
    parts.append(parser.finish())
    total.extend(parts[-1])
    return total, parts


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_reasoning_split_streamed_equals_whole(step):
    text = "Let me see.\nTwo and two.\n</think>\n\nThe answer is 4.\n"
    total, parts = parse(text, step, in_reasoning=True)
    assert total.reasoning == "Let me see.\nTwo and two."
    assert total.content == "The answer is 4.\n"
    assert all("<" not in p.content + p.reasoning for p in parts)


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_reply_that_opens_think_itself(step):
    total, _ = parse("<think>\nhmm\n</think>\n\nok", step)
    assert (total.reasoning, total.content) == ("hmm", "ok")
    total, _ = parse("<thinking is fun", step)
    assert (total.reasoning, total.content) == ("", "<thinking is fun")


def test_unclosed_reasoning_and_no_reasoning():
    total, _ = parse("still thinking ", 3, in_reasoning=True)
    assert (total.reasoning, total.content) == ("still thinking", "")
    total, _ = parse("plain answer", 3)
    assert (total.reasoning, total.content) == ("", "plain answer")


@pytest.mark.parametrize("step", [1, 5, 1000])
def test_tool_calls_streamed_equal_whole(step):
    text = "I will check.\n\n" + CALL + "\n" + CALL.replace("Paris", "Oslo")
    total, parts = parse(text, step, parse_tools=True, schemas=SCHEMAS)
    assert total.content == "I will check."
    assert [c.name for c in total.tool_calls] == ["get_weather"] * 2
    args = json.loads(total.tool_calls[0].arguments)
    assert args == {"city": "Paris", "days": 3, "metric": True, "hours": [1, 2], "limit": None}
    assert json.loads(total.tool_calls[1].arguments)["city"] == "Oslo"
    assert all("<tool" not in p.content for p in parts)


def test_tool_calls_off_single_call_and_broken_calls():
    total, _ = parse("x " + CALL, 4, parse_tools=False)
    assert total.content == "x " + CALL and not total.tool_calls
    total, _ = parse(CALL + CALL, 4, parse_tools=True, parallel_tool_calls=False)
    assert len(total.tool_calls) == 1
    total, _ = parse("a <tool_call>\n<function=f>\n<param", 3, parse_tools=True)
    assert total.content == "a<tool_call>\n<function=f>\n<param" and not total.tool_calls
    total, _ = parse("<tool_call>nonsense</tool_call>", 3, parse_tools=True)
    assert total.content == "<tool_call>nonsense</tool_call>"


def test_values_follow_the_schema():
    assert convert_value("5", {"type": "integer"}) == 5
    assert convert_value("5", None) == "5"
    assert convert_value("2.5", {"type": "number"}) == 2.5
    assert convert_value("{'a': True}", {"type": "object"}) == {"a": True}
    assert convert_value("abc", {"type": "integer"}) == "abc"
    assert convert_value("7", {"anyOf": [{"type": "string"}, {"type": "integer"}]}) == 7
    call = parse_tool_call('{"name": "f", "arguments": {"x": 1}}', {})
    assert call is not None and (call.name, json.loads(call.arguments)) == ("f", {"x": 1})


def chat(**kw) -> ChatRequest:
    return ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **kw})


def test_template_renders_thinking_tools_and_forced_calls():
    template = ChatTemplate(TEMPLATE)
    prompt = build_chat_prompt(template, chat())
    assert prompt.text.endswith("<|im_start|>assistant\n<think>\n") and prompt.in_reasoning
    off = build_chat_prompt(template, chat(chat_template_kwargs={"enable_thinking": False}))
    assert off.text.endswith("</think>\n\n") and not off.in_reasoning
    tools = build_chat_prompt(template, chat(tools=[WEATHER]))
    assert '"name": "get_weather"' in tools.text and tools.parse_tools
    assert (
        "get_weather"
        not in build_chat_prompt(template, chat(tools=[WEATHER], tool_choice="none")).text
    )
    named = chat(
        tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}
    )
    forced = build_chat_prompt(template, named)
    assert forced.text.endswith("</think>\n\n<tool_call>\n<function=get_weather>\n")
    parser = forced.parser()
    delta = parser.feed("<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>")
    assert [c.name for c in delta.tool_calls] == ["get_weather"]


def test_template_history_with_tool_calls_and_list_content():
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    text = build_chat_prompt(ChatTemplate(TEMPLATE), chat(messages=messages)).text
    assert "<parameter=city>\nParis\n</parameter>" in text and "sunny" in text


def test_template_errors_and_sandbox():
    with pytest.raises(ApiError) as err:
        ChatTemplate("{{ raise_exception('no system role') }}").render([])
    assert err.value.status == 400 and "no system role" in err.value.message
    with pytest.raises(ApiError):
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    with pytest.raises(ApiError):
        ChatTemplate("{% set x = messages.append(1) %}").render([])
    assert ChatTemplate("{% generation %}a{% endgeneration %}").render([]) == "a"
    with pytest.raises(ApiError) as err:
        build_chat_prompt(
            ChatTemplate(TEMPLATE),
            chat(
                messages=[
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            ),
        )
    assert err.value.param == "messages[0].content[0]"


def test_shipped_default_template_renders():
    path = Path(__file__).parents[2] / "flashlane" / "default_model" / "chat_template.jinja"
    template = ChatTemplate(path.read_text())
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "call it",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": '{"city": "Paris", "days": 2}',
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    prompt = build_chat_prompt(template, chat(messages=messages, tools=[WEATHER]))
    assert "<parameter=days>\n2\n</parameter>" in prompt.text
    assert prompt.text.endswith("<|im_start|>assistant\n<think>\n") and prompt.in_reasoning
