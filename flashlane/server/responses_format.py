"""OpenAI Responses requests (POST /v1/responses) translated into chat requests. Stateless:
`previous_response_id` and stored conversations are refused; a client sends the whole input.

instructions -> a system message; input (text, or items: messages with text content,
function_call and function_call_output, reasoning) -> chat messages; tools (flat function
definitions) -> chat tools; text.format (json_schema, json_object) -> response_format;
max_output_tokens -> max_tokens.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from flashlane.server.protocol import ApiError, ChatRequest, Strict, parse_request


class ResponsesRequest(Strict):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    stream: bool = False
    previous_response_id: str | None = None
    seed: int | None = None  # flashlane's extra, as on the chat endpoint
    top_k: int | None = Field(None, ge=-1)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extra (enable_thinking, ...)


def chat_request(req: ResponsesRequest) -> ChatRequest:
    if req.previous_response_id is not None:
        msg = "previous_response_id is not supported: this server is stateless, send the input"
        raise ApiError(400, msg, param="previous_response_id")
    messages: list[dict[str, Any]] = []
    if req.instructions:
        messages.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        messages.append({"role": "user", "content": req.input})
    else:
        for i, item in enumerate(req.input):
            _add_item(messages, item, f"input[{i}]")
    body: dict[str, Any] = {
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_output_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "seed": req.seed,
        "parallel_tool_calls": req.parallel_tool_calls,
        "chat_template_kwargs": req.chat_template_kwargs,
    }
    if req.tools:
        body["tools"] = [_tool(t, f"tools[{i}]") for i, t in enumerate(req.tools)]
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    fmt = (req.text or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        body["response_format"] = {"type": "json_schema", "json_schema": fmt}
    elif isinstance(fmt, dict):
        body["response_format"] = {"type": fmt.get("type", "text")}
    return parse_request(ChatRequest, {k: v for k, v in body.items() if v is not None})


def _add_item(messages: list[dict[str, Any]], item: dict[str, Any], at: str) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        content = item.get("content", "")
        text = content if isinstance(content, str) else _text(content, at)
        messages.append({"role": role, "content": text})
    elif kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)  # parallel calls: one assistant turn
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output", "")
        text = output if isinstance(output, str) else _text(output, at)
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
    elif kind != "reasoning":  # earlier reasoning is not replayed to the model
        raise ApiError(400, f"input item type {kind!r} is not supported", param=at)


def _text(parts: list[Any], at: str) -> str:
    out = []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text", "text"):
            msg = f"content type {kind!r} is not supported"
            raise ApiError(400, msg, param=f"{at}.content[{j}]")
        out.append(str(part.get("text", "")))
    return "".join(out)


def _tool(tool: dict[str, Any], at: str) -> dict[str, Any]:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        msg = f"only function tools are supported, not {tool.get('type')!r}"
        raise ApiError(400, msg, param=at)
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}


def _tool_choice(choice: str | dict[str, Any]) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise ApiError(400, f"tool_choice {choice!r} is not supported", param="tool_choice")
