"""Chat message boundaries: where each rendered message ends in the prompt's token ids (the
prompt cache keeps states there), skipped where the tokenizer merges across the seam, capped
for long conversations, and passed by the chat endpoint (not by completions) to the engine."""

from __future__ import annotations

import httpx

from flashlane.server.chat import ChatTemplate, build_chat_prompt, message_ends
from flashlane.server.protocol import ChatRequest
from tests.server.fake_engine import TEMPLATE

SYSTEM = "You are a server. " + "The quick brown fox jumps over the lazy dog. " * 3


def conversation(num_turns: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}]
    for i in range(num_turns):
        messages.append({"role": "user", "content": f"What is {i} plus two?"})
        messages.append({"role": "assistant", "content": f"It is {i + 2}."})
    messages.append({"role": "user", "content": "And the weather in Paris?"})
    return messages


def ends_of(template: ChatTemplate, tokenizer, body: dict) -> tuple[list[int], list[int]]:
    """(the prompt's ids, message_ends) for a request body."""
    req = ChatRequest.model_validate({"model": "m", **body})
    prompt = build_chat_prompt(template, req)

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False).ids

    ids = encode(prompt.text)
    return ids, message_ends(template, req, ids, encode)


def test_each_message_ends_where_its_render_ends(tokenizer):
    template = ChatTemplate(TEMPLATE)
    messages = conversation(1)
    ids, ends = ends_of(template, tokenizer, {"messages": messages})
    assert len(ends) == len(messages) and ends == sorted(ends) and ends[-1] < len(ids)
    for i, end in enumerate(ends):
        text = tokenizer.decode(ids[:end], skip_special_tokens=False)
        assert text == template.render(messages[: i + 1], add_generation_prompt=False)
        assert text.endswith("<|im_end|>\n")


def test_tools_are_rendered_into_every_prefix(tokenizer):
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    messages = conversation(1)
    ids, ends = ends_of(ChatTemplate(TEMPLATE), tokenizer, {"messages": messages, "tools": [tool]})
    assert len(ends) == len(messages)
    assert "get_weather" in tokenizer.decode(ids[: ends[0]], skip_special_tokens=False)
    # tool_choice none hides the tools from the prompt and from its prefixes alike
    body = {"messages": messages, "tools": [tool], "tool_choice": "none"}
    assert len(ends_of(ChatTemplate(TEMPLATE), tokenizer, body)[1]) == len(messages)


def test_a_boundary_the_tokenizer_merges_across_is_skipped(tokenizer):
    template = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}")
    parts = ["The", " hel", "lo world"]
    messages = [{"role": "user", "content": c} for c in parts]
    ids, ends = ends_of(template, tokenizer, {"messages": messages})
    # "The hel" ends in a token that "The hello world" does not have
    seam = tokenizer.encode("The hel", add_special_tokens=False).ids
    assert ids[: len(seam)] != seam
    # the last message ends where the prompt does: no mark to add there
    assert ends == [len(tokenizer.encode("The", add_special_tokens=False).ids)]


def test_a_template_refusing_a_partial_conversation_gives_no_boundary(tokenizer):
    source = (
        "{% if messages[-1].role != 'user' %}{{ raise_exception('ends with a user') }}{% endif %}"
        + TEMPLATE
    )
    messages = conversation(1)
    ends = ends_of(ChatTemplate(source), tokenizer, {"messages": messages})[1]
    # the system and assistant turns cannot end a render: their boundaries are left out
    full = ends_of(ChatTemplate(TEMPLATE), tokenizer, {"messages": messages})[1]
    assert ends == [end for i, end in enumerate(full) if messages[i]["role"] == "user"]


def test_long_conversations_mark_their_first_and_last_messages(tokenizer):
    messages = conversation(10)  # 22 messages
    ends = ends_of(ChatTemplate(TEMPLATE), tokenizer, {"messages": messages})[1]
    template = ChatTemplate(TEMPLATE)
    every = []
    for i in range(len(messages)):
        text = template.render(messages[: i + 1], add_generation_prompt=False)
        every.append(len(tokenizer.encode(text, add_special_tokens=False).ids))
    assert ends == every[:2] + every[-6:]


def test_chat_passes_boundaries_and_completions_none(engine, live):
    messages = conversation(2)
    body = {"model": "fake-flash", "messages": messages, "max_tokens": 4}
    r = httpx.post(f"{live.url}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    rid, ids, _ = engine.started[-1]
    ids_again, ends = ends_of(ChatTemplate(TEMPLATE), engine.tokenizer, body)
    assert ids == ids_again and engine.boundaries[rid] == ends and len(ends) == len(messages)
    body = {"model": "fake-flash", "prompt": "The quick fox", "max_tokens": 4}
    r = httpx.post(f"{live.url}/v1/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert engine.boundaries[engine.started[-1][0]] == []
