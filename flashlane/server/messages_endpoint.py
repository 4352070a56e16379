"""POST /v1/messages: the Anthropic Messages API over the chat pipeline.

The request becomes a chat request (messages_format.py) and runs as one; the reply's blocks
(blocks.py) become Anthropic content: thinking, text and tool_use blocks, stop_reason and
usage. Streaming sends Anthropic's events (message_start, content_block_start / _delta /
_stop, message_delta, message_stop); errors use Anthropic's error shape.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from flashlane.request import FinishReason, RequestOutput
from flashlane.server.blocks import Block, BlockEvent, BlockWriter
from flashlane.server.chat_endpoint import checked, one_reply, prepare_chat
from flashlane.server.messages_format import MessagesRequest, chat_request, stop_reason
from flashlane.server.protocol import ApiError, parse_request
from flashlane.server.state import ServerState
from flashlane.server.transport import EventStream, read_json, until_disconnect

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


async def messages(request: Request) -> Response:
    try:
        return await _messages(request)
    except ApiError as e:
        return JSONResponse(anthropic_error(e), status_code=e.status)


def anthropic_error(e: ApiError) -> dict[str, Any]:
    kind = _ERROR_TYPES.get(e.status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": e.message}}


async def _messages(request: Request) -> Response:
    state: ServerState = request.app.state.flashlane
    req = parse_request(MessagesRequest, await read_json(request, state.max_body_bytes))
    chat = chat_request(req)
    rid = f"msg_{secrets.token_hex(12)}"
    job = await until_disconnect(request, state.offload(prepare_chat, state, chat, rid, None))
    reply = _Reply(rid, state.model_name, len(job.prompt_ids))
    parser = job.prompt.parser()
    out = await one_reply(request, rid, job, req.stream, lambda run: reply.events(run, parser))
    if isinstance(out, EventStream):
        return out
    writer = BlockWriter()
    delta = parser.feed(out.text)
    delta.extend(parser.finish())
    writer.feed(delta)
    writer.close()
    return JSONResponse(reply.message(writer, out))


def _content(block: Block) -> dict[str, Any]:
    if block.kind == "thinking":
        return {"type": "thinking", "thinking": block.text, "signature": ""}
    if block.kind == "text":
        return {"type": "text", "text": block.text}
    assert block.call is not None
    return {
        "type": "tool_use",
        "id": f"toolu_{secrets.token_hex(12)}",
        "name": block.call.name,
        "input": json.loads(block.call.arguments),
    }


def _event(kind: str, body: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **body}, ensure_ascii=False)}\n\n"


class _Reply:
    def __init__(self, rid: str, model: str, num_prompt: int) -> None:
        self.id, self.model, self.num_prompt = rid, model, num_prompt

    def _head(self) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model}

    def _end(self, writer: BlockWriter, out: RequestOutput) -> dict[str, Any]:
        finish = FinishReason(out.finish_reason or "abort").value
        return {
            "stop_reason": stop_reason(finish, writer.has_tool_calls, out.stop_string),
            "stop_sequence": out.stop_string,
        }

    def message(self, writer: BlockWriter, out: RequestOutput) -> dict[str, Any]:
        return {
            **self._head(),
            "content": [_content(b) for b in writer.blocks],
            **self._end(writer, out),
            "usage": {"input_tokens": self.num_prompt, "output_tokens": len(out.token_ids)},
        }

    async def events(self, run, parser) -> AsyncIterator[str]:
        writer = BlockWriter()
        usage = {"input_tokens": self.num_prompt, "output_tokens": 0}
        start = {**self._head(), "content": [], "stop_reason": None, "stop_sequence": None}
        yield _event("message_start", {"message": {**start, "usage": usage}})
        try:
            async for piece in run.pieces():
                out = piece.output
                checked(out)
                delta = parser.feed(piece.text)
                if piece.finished:
                    delta.extend(parser.finish())
                for event in writer.feed(delta) + (writer.close() if piece.finished else []):
                    yield self._block_event(event)
                if piece.finished:
                    tail = {"output_tokens": len(out.token_ids)}
                    yield _event("message_delta", {"delta": self._end(writer, out), "usage": tail})
                    yield _event("message_stop", {})
        except ApiError as e:
            yield _event("error", {"error": anthropic_error(e)["error"]})

    def _block_event(self, event: BlockEvent) -> str:
        block = event.block
        if event.kind == "open":
            opened = _content(block)
            if block.kind == "tool":
                opened["input"] = {}
            else:
                opened[block.kind] = ""
            return _event("content_block_start", {"index": block.index, "content_block": opened})
        if event.kind == "close":
            return _event("content_block_stop", {"index": block.index})
        kinds = {"thinking": ("thinking_delta", "thinking"), "text": ("text_delta", "text"),
                 "tool": ("input_json_delta", "partial_json")}  # fmt: skip
        kind, key = kinds[block.kind]
        return _event(
            "content_block_delta", {"index": block.index, "delta": {"type": kind, key: event.text}}
        )
