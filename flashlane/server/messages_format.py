"""Anthropic Messages requests (POST /v1/messages) translated into chat requests.

system (text or text blocks) -> a system message; user and assistant content (text or blocks)
-> chat messages: text blocks join, an assistant's tool_use blocks become tool calls and its
thinking blocks its reasoning, a user's tool_result blocks become tool messages (before the
rest of that turn's text). tools (name, description, input_schema) -> functions; tool_choice
auto / any / tool / none -> auto / required / named / none, disable_parallel_tool_use ->
parallel_tool_calls false; stop_sequences -> stop; output_config.format (a JSON schema) ->
response_format; thinking {"type": "disabled"} closes the
model's thinking (the template's enable_thinking).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from flashlane.server.protocol import ApiError, ChatRequest, Strict, parse_request


class AnthropicTool(Strict):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})


class AnthropicMessage(Strict):
    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class MessagesRequest(Strict):
    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[AnthropicMessage] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None  # format: {"type": "json_schema", "schema"}
    seed: int | None = None  # flashlane's extra, as on the chat endpoint


def chat_request(req: MessagesRequest) -> ChatRequest:
    """The chat request a Messages request means; 400 naming the field for what it cannot."""
    messages: list[dict[str, Any]] = []
    if req.system:
        messages.append({"role": "system", "content": _text(req.system, "system")})
    for i, message in enumerate(req.messages):
        messages += _messages(message, f"messages[{i}]")
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "stop": req.stop_sequences,
        "seed": req.seed,
    }
    fmt = (req.output_config or {}).get("format")
    if isinstance(fmt, dict):
        body["response_format"] = {"type": fmt.get("type"), "json_schema": fmt}
    if req.tools:
        body["tools"] = [
            {"type": "function", "function": {
                "name": t.name, "description": t.description, "parameters": t.input_schema
            }}
            for t in req.tools
        ]  # fmt: skip
    if req.tool_choice is not None:
        body["tool_choice"], body["parallel_tool_calls"] = _tool_choice(req.tool_choice)
    if (req.thinking or {}).get("type") == "disabled":
        body["chat_template_kwargs"] = {"enable_thinking": False}
    return parse_request(ChatRequest, {k: v for k, v in body.items() if v is not None})


def _tool_choice(choice: dict[str, Any]) -> tuple[Any, bool]:
    kind = choice.get("type")
    parallel = not choice.get("disable_parallel_tool_use", False)
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise ApiError(400, f"tool_choice type {kind!r} is not supported", param="tool_choice")


def _messages(message: AnthropicMessage, where: str) -> list[dict[str, Any]]:
    """One Anthropic turn as chat messages (a user turn's tool results first, as tool
    messages, then its text; an assistant turn as one message)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    out: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for j, block in enumerate(message.content):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_result" and message.role == "user":
            content = block.get("content", "")
            result = content if isinstance(content, str) else _text(content, at)
            call_id = block.get("tool_use_id")
            out.append({"role": "tool", "tool_call_id": call_id, "content": result})
        elif kind == "tool_use" and message.role == "assistant":
            arguments = block.get("input") or {}
            calls.append({
                "id": block.get("id"), "type": "function",
                "function": {"name": block.get("name"), "arguments": json.dumps(arguments)},
            })  # fmt: skip
        elif kind == "thinking" and message.role == "assistant":
            reasoning.append(str(block.get("thinking", "")))
        elif kind != "redacted_thinking":
            raise ApiError(400, f"content block type {kind!r} is not supported here", param=at)
    if message.role == "user":
        return out + ([{"role": "user", "content": "".join(texts)}] if texts else [])
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if calls:
        reply["tool_calls"] = calls
    if reasoning:
        reply["reasoning_content"] = "".join(reasoning)
    return [reply]


def _text(value: str | list[Any], param: str) -> str:
    """Text or a list of text blocks as one text; 400 for any other block."""
    if isinstance(value, str):
        return value
    parts = []
    for block in value:
        if not (isinstance(block, dict) and block.get("type") == "text"):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ApiError(400, f"only text blocks are supported here, not {kind!r}", param=param)
        parts.append(str(block.get("text", "")))
    return "".join(parts)


def stop_reason(finish: str, has_tool_calls: bool, stop_sequence: str | None) -> str:
    """Anthropic's stop_reason for a finished reply."""
    if finish == "length":
        return "max_tokens"
    if has_tool_calls:
        return "tool_use"
    return "stop_sequence" if stop_sequence else "end_turn"
