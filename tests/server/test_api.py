"""The live server with the official openai client: chat and completions, streamed and not."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.fake_engine import FakeEngine

THINK = "Two and two.\n</think>\n\nThe answer is 4."
CALL = (
    "I will check.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        },
    },
}
USER = [{"role": "user", "content": "what is 2+2?"}]


@pytest.fixture
def engine(engine: FakeEngine) -> FakeEngine:
    engine.scripts.update({"2+2": THINK, "weather in Paris": CALL})
    return engine


def stream_text(chunks) -> tuple[str, str, list, list]:
    content, reasoning, finishes, calls = "", "", [], []
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            calls += delta.tool_calls or []
            finishes += [choice.finish_reason] if choice.finish_reason else []
    return content, reasoning, finishes, calls


def test_chat_reasoning_split_and_usage(live):
    client = live.client()
    reply = client.chat.completions.create(model="fake-flash", messages=USER)
    message = reply.choices[0].message
    assert (message.content, message.reasoning_content) == ("The answer is 4.", "Two and two.")
    assert reply.choices[0].finish_reason == "stop"
    usage = reply.usage
    assert usage.completion_tokens_details.reasoning_tokens > 0
    assert usage.completion_tokens > usage.completion_tokens_details.reasoning_tokens
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens // 2
    assert isinstance(reply.seed, int)

    chunks = list(
        client.chat.completions.create(
            model="fake-flash", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    content, reasoning, finishes, _ = stream_text(chunks)
    assert (content, reasoning, finishes) == (message.content, message.reasoning_content, ["stop"])
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == usage.total_tokens


def test_chat_thinking_off_gives_plain_content(live, engine):
    engine.scripts["plain"] = "Just content."
    reply = live.client().chat.completions.create(
        model="fake-flash",
        messages=[{"role": "user", "content": "plain"}],
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    message = reply.choices[0].message
    assert (
        message.content == "Just content." and getattr(message, "reasoning_content", None) is None
    )
    assert "</think>\n\n" in engine.tokenizer.decode(
        engine.started[-1][1], skip_special_tokens=False
    )


@pytest.mark.parametrize("stream", [False, True])
def test_chat_tool_calls(live, stream):
    messages = [{"role": "user", "content": "weather in Paris?"}]
    client = live.client()
    reply = client.chat.completions.create(
        model="fake-flash", messages=messages, tools=[WEATHER], stream=stream
    )
    if stream:
        content, reasoning, finishes, calls = stream_text(reply)
        assert finishes == ["tool_calls"] and calls[0].index == 0
    else:
        message = reply.choices[0].message
        content, reasoning, calls = message.content, message.reasoning_content, message.tool_calls
        assert reply.choices[0].finish_reason == "tool_calls"
    assert (content or None, reasoning) == (None, "I will check.")
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "Paris", "days": 3}
    assert calls[0].id.startswith("call_")


def test_chat_tool_choice_none_leaves_the_call_as_text(live, engine):
    reply = live.client().chat.completions.create(
        model="fake-flash",
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER],
        tool_choice="none",
    )
    assert "<tool_call>" in reply.choices[0].message.content
    assert not reply.choices[0].message.tool_calls
    prompt = engine.tokenizer.decode(engine.started[-1][1], skip_special_tokens=False)
    assert "get_weather" not in prompt


def test_chat_named_tool_choice_forces_the_call(live, engine):
    engine.scripts["forced"] = "<parameter=city>\nRome\n</parameter>\n</function>\n</tool_call>"
    reply = live.client().chat.completions.create(
        model="fake-flash",
        messages=[{"role": "user", "content": "forced"}],
        tools=[WEATHER],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    call = reply.choices[0].message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Rome"},
    )


def test_seeds_reproduce_and_are_returned(live, engine):
    client = live.client()
    a = client.completions.create(model="fake-flash", prompt="hello", max_tokens=8, seed=11)
    b = client.completions.create(model="fake-flash", prompt="hello", max_tokens=8, seed=11)
    c = client.completions.create(model="fake-flash", prompt="hello", max_tokens=8)
    assert a.seed == b.seed == 11 and a.choices[0].text == b.choices[0].text
    again = client.completions.create(model="fake-flash", prompt="hello", max_tokens=8, seed=c.seed)
    assert again.choices[0].text == c.choices[0].text
    top = client.completions.create(
        model="fake-flash", prompt="hello", max_tokens=8, seed=2**63 - 1
    )
    assert top.seed == engine.started[-1][2].seed == 2**63 - 1
    with pytest.raises(openai.BadRequestError):  # seeds are 63 bits, never wrapped (issue 30)
        client.completions.create(model="fake-flash", prompt="hello", max_tokens=8, seed=-1)
    assert {s[2].temperature for s in engine.started} == {0.7}  # generation_config default


def test_sampling_fields_reach_the_engine(live, engine):
    live.client().chat.completions.create(
        model="fake-flash",
        messages=USER,
        temperature=0,
        top_p=0.5,
        max_completion_tokens=30,
        stop=["zz"],
        logit_bias={"5": 1.0},
        presence_penalty=0.5,
        extra_body={
            "top_k": -1,
            "min_p": 0.1,
            "repetition_penalty": 1.1,
            "draft": False,
            "thinking_budget": 7,
            "ignore_eos": True,
            "stop_token_ids": [3],
        },
    )
    params = engine.started[-1][2]
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0, 0.5, 0, 0.1)
    assert (params.max_tokens, params.stop, params.logit_bias) == (30, ["zz"], {5: 1.0})
    assert (params.draft, params.thinking_budget, params.ignore_eos) == (False, 7, True)
    assert (params.stop_token_ids, params.repetition_penalty) == ([3], 1.1)
    assert params.presence_penalty == 0.5


@pytest.mark.parametrize("stream", [False, True])
def test_completion_stop_string_is_cut_and_held_back(live, engine, stream):
    engine.scripts["STOPTEST"] = "alpha beta gamma delta"
    client = live.client()
    kw = dict(model="fake-flash", prompt="STOPTEST", max_tokens=50, stop=["gamma d", "never"])
    if not stream:
        reply = client.completions.create(**kw)
        assert (reply.choices[0].text, reply.choices[0].finish_reason) == ("alpha beta ", "stop")
        return
    pieces = [c.choices[0].text for c in client.completions.create(**kw, stream=True)]
    assert "".join(pieces) == "alpha beta "
    assert all("gam" not in p for p in pieces)


def test_completion_never_streams_half_a_character(live, engine):
    engine.scripts["UTF"] = "日本 😀 ß"
    pieces = [
        c.choices[0].text
        for c in live.client().completions.create(
            model="fake-flash", prompt="UTF", max_tokens=50, stream=True
        )
    ]
    assert "".join(pieces) == "日本 😀 ß" and all("\ufffd" not in p for p in pieces)


def test_completion_logprobs_echo_and_token_prompts(live, engine):
    client = live.client()
    ids = engine.tokenizer.encode("hello world", add_special_tokens=False).ids
    reply = client.completions.create(
        model="fake-flash", prompt=ids, max_tokens=4, logprobs=2, echo=True, seed=1
    )
    choice = choice0 = reply.choices[0]
    assert choice.text.startswith("hello world")
    lp = choice.logprobs
    assert len(lp.tokens) == len(ids) + 4 == reply.usage.total_tokens
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert all(len(t) <= 2 for t in lp.top_logprobs[1:])
    assert lp.text_offset[len(ids)] == len("hello world")
    only = client.completions.create(
        model="fake-flash", prompt=ids, max_tokens=0, echo=True, logprobs=0
    )
    assert only.choices[0].text == "hello world" and only.usage.completion_tokens == 0
    assert only.choices[0].logprobs.token_logprobs == choice0.logprobs.token_logprobs[: len(ids)]


def test_completion_batch_of_prompts(live):
    client = live.client()
    reply = client.completions.create(
        model="fake-flash", prompt=["hello", "the river"], max_tokens=5, seed=2
    )
    alone = [
        client.completions.create(model="fake-flash", prompt=p, max_tokens=5, seed=2)
        for p in ["hello", "the river"]
    ]
    assert [c.text for c in reply.choices] == [a.choices[0].text for a in alone]
    chunks = client.completions.create(
        model="fake-flash", prompt=["hello", "the river"], max_tokens=5, seed=2, stream=True
    )
    texts = ["", ""]
    for chunk in chunks:
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == [c.text for c in reply.choices]


def test_chat_logprobs(live):
    reply = live.client().chat.completions.create(
        model="fake-flash", messages=USER, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    assert all(len(item.top_logprobs) <= 3 and item.logprob <= 0 for item in content)
    assert bytes(content[0].bytes).decode() == content[0].token
    chunks = live.client().chat.completions.create(
        model="fake-flash", messages=USER, logprobs=True, stream=True
    )
    streamed = [i for c in chunks for ch in c.choices if ch.logprobs for i in ch.logprobs.content]
    assert [i.logprob for i in streamed] == [i.logprob for i in content]


def test_models_tokenize_detokenize(live, engine):
    client = live.client()
    assert [m.id for m in client.models.list()] == ["fake-flash"]
    import httpx

    r = httpx.post(f"{live.url}/tokenize", json={"prompt": "hello world"})
    ids = r.json()["tokens"]
    assert ids == engine.tokenizer.encode("hello world").ids and r.json()["count"] == len(ids)
    r = httpx.post(f"{live.url}/detokenize", json={"tokens": ids})
    assert r.json() == {"prompt": "hello world"}
    r = httpx.post(f"{live.url}/tokenize", json={"messages": USER})
    assert r.json()["count"] > len(ids)
