"""POST /v1/responses: the OpenAI Responses API over the chat pipeline, stateless.

The request becomes a chat request (responses_format.py); the reply's blocks (blocks.py)
become output items: reasoning, a message with output_text, function_call. Streaming sends the
Responses events (response.created, output_item.added, output_text.delta, ..., completed),
each with its sequence_number.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from flashlane.request import FinishReason, RequestOutput
from flashlane.server.blocks import Block, BlockEvent, BlockWriter
from flashlane.server.chat_endpoint import checked, one_reply, prepare_chat
from flashlane.server.protocol import ApiError, parse_request
from flashlane.server.responses_format import ResponsesRequest, chat_request
from flashlane.server.state import ServerState
from flashlane.server.transport import EventStream, read_json, sse, until_disconnect


async def responses(request: Request) -> Response:
    state: ServerState = request.app.state.flashlane
    req = parse_request(ResponsesRequest, await read_json(request, state.max_body_bytes))
    rid = f"resp_{secrets.token_hex(12)}"
    chat = chat_request(req)
    job = await until_disconnect(request, state.offload(prepare_chat, state, chat, rid, None))
    parser = job.prompt.parser()
    reply = _Reply(state, rid, req, len(job.prompt_ids), parser)
    out = await one_reply(request, rid, job, req.stream, lambda run: reply.events(run, parser))
    if isinstance(out, EventStream):
        return out
    delta = parser.feed(out.text)
    delta.extend(parser.finish())
    reply.writer.feed(delta)
    reply.writer.close()
    return JSONResponse(reply.response(out))


class _Reply:
    def __init__(
        self, state: ServerState, rid: str, req: ResponsesRequest, num_prompt: int, parser
    ) -> None:
        self.state, self.parser = state, parser
        self.id, self.model, self.req, self.num_prompt = rid, state.model_name, req, num_prompt
        self.created = int(time.time())
        self.writer = BlockWriter()
        self.item_ids: dict[int, str] = {}  # block index -> its output item's id
        self.num_events = 0

    def _item_id(self, block: Block) -> str:
        prefix = {"thinking": "rs", "text": "msg", "tool": "fc"}[block.kind]
        return self.item_ids.setdefault(block.index, f"{prefix}_{secrets.token_hex(12)}")

    def _item(self, block: Block, done: bool = True) -> dict[str, Any]:
        item_id, status = self._item_id(block), "completed" if done else "in_progress"
        if block.kind == "thinking":
            text = [{"type": "reasoning_text", "text": block.text}] if done else []
            return {"type": "reasoning", "id": item_id, "summary": [], "content": text}
        if block.kind == "text":
            parts = [_text_part(block.text)] if done else []
            return {"type": "message", "id": item_id, "status": status, "role": "assistant",
                    "content": parts}  # fmt: skip
        assert block.call is not None
        return {
            "type": "function_call",
            "id": item_id,
            "call_id": f"call_{item_id[3:]}",
            "name": block.call.name,
            "arguments": block.call.arguments if done else "",
            "status": status,
        }

    def response(self, out: RequestOutput | None) -> dict[str, Any]:
        """The response object; `out` None while it runs."""
        req = self.req
        incomplete = out is not None and out.finish_reason == FinishReason.LENGTH
        status = "in_progress" if out is None else "incomplete" if incomplete else "completed"
        body: dict[str, Any] = {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "model": self.model,
            "output": [self._item(b) for b in self.writer.blocks] if out is not None else [],
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "parallel_tool_calls": req.parallel_tool_calls,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "text": req.text or {"format": {"type": "text"}},
        }
        if out is not None:
            num_out = len(out.token_ids)
            body["usage"] = {
                "input_tokens": self.num_prompt,
                "input_tokens_details": {"cached_tokens": out.stats.cached_tokens},
                "output_tokens": num_out,
                "output_tokens_details": {
                    "reasoning_tokens": self.state.reasoning_tokens(out.token_ids, self.parser)
                },
                "total_tokens": self.num_prompt + num_out,
            }
        return body

    def _event(self, kind: str, **body: Any) -> str:
        self.num_events += 1
        return sse({"type": kind, "sequence_number": self.num_events - 1, **body})

    async def events(self, run, parser) -> AsyncIterator[str]:
        yield self._event("response.created", response=self.response(None))
        yield self._event("response.in_progress", response=self.response(None))
        try:
            async for piece in run.pieces():
                out = piece.output
                checked(out)
                delta = parser.feed(piece.text)
                if piece.finished:
                    delta.extend(parser.finish())
                events = self.writer.feed(delta) + (self.writer.close() if piece.finished else [])
                for event in events:
                    for line in self._block_events(event):
                        yield line
                if piece.finished:
                    final = self.response(out)
                    yield self._event(f"response.{final['status']}", response=final)
        except ApiError as e:
            yield self._event("error", code=e.code, message=e.message, param=e.param)

    def _block_events(self, event: BlockEvent) -> list[str]:
        block = event.block
        at = {"item_id": self._item_id(block), "output_index": block.index}
        if event.kind == "open":
            out = [self._event("response.output_item.added", output_index=block.index,
                               item=self._item(block, done=False))]  # fmt: skip
            if block.kind == "text":
                part = _text_part("")
                out.append(self._event("response.content_part.added", **at, content_index=0,
                                       part=part))  # fmt: skip
            return out
        if event.kind == "delta":
            if block.kind == "tool":
                return [self._event("response.function_call_arguments.delta", **at,
                                    delta=event.text)]  # fmt: skip
            kind = (
                "response.output_text.delta"
                if block.kind == "text"
                else ("response.reasoning_text.delta")
            )
            extra = {"logprobs": []} if block.kind == "text" else {}
            return [self._event(kind, **at, content_index=0, delta=event.text, **extra)]
        out = []
        if block.kind == "tool":
            out.append(self._event("response.function_call_arguments.done", **at,
                                   arguments=block.text))  # fmt: skip
        elif block.kind == "text":
            out.append(self._event("response.output_text.done", **at, content_index=0,
                                   text=block.text, logprobs=[]))  # fmt: skip
            out.append(self._event("response.content_part.done", **at, content_index=0,
                                   part=_text_part(block.text)))  # fmt: skip
        else:
            out.append(self._event("response.reasoning_text.done", **at, content_index=0,
                                   text=block.text))  # fmt: skip
        out.append(self._event("response.output_item.done", output_index=block.index,
                               item=self._item(block)))  # fmt: skip
        return out


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
