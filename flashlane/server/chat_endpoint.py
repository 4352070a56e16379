"""POST /v1/chat/completions: render, run, and answer as JSON or as SSE chunks."""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from flashlane.request import FinishReason, RequestOutput, SamplingParams
from flashlane.server.body import parse_body
from flashlane.server.chat import ChatPrompt, build_chat_prompt, message_ends
from flashlane.server.engine_api import EngineLike
from flashlane.server.generate import ReplyRun, reply_budget, sampling_params
from flashlane.server.logprobs import chat_logprobs
from flashlane.server.protocol import ApiError, ChatRequest
from flashlane.server.reply import ReplyDelta, ReplyParser
from flashlane.server.state import ServerState, finish_reason, usage
from flashlane.server.transport import (
    EventStream,
    guarded_events,
    read_body,
    sse,
    until_disconnect,
)


async def chat_completions(request: Request) -> Response:
    state: ServerState = request.app.state.flashlane
    engine = state.engine()
    body = await read_body(request, state.max_body_bytes)
    job = await until_disconnect(request, state.offload(_prepare, state, engine, body))
    run = state.new_run(job.ids, job.params, job.reply.id + "-0", boundaries=job.ends)
    request.state.reply_id, request.state.runs = job.reply.id, [run]
    try:
        await until_disconnect(request, run.start())
        if job.req.stream:
            reply = job.reply
            return EventStream(guarded_events(reply.events(run), reply.id), on_close=run.close)
        out = await until_disconnect(request, run.run())
    except BaseException:
        run.close()
        raise
    return JSONResponse(job.reply.whole(out))


@dataclass(frozen=True, slots=True)
class _ChatJob:
    """A chat request made ready on a prep thread: everything but the run."""

    req: ChatRequest
    reply: _ChatReply
    ids: list[int]  # the rendered prompt's token ids
    params: SamplingParams
    ends: list[int]  # where messages end (prompt-cache marks)


def _prepare(state: ServerState, engine: EngineLike, body: bytes) -> _ChatJob:
    """Parse, render, tokenize and check a chat request (a prep thread's work)."""
    req = parse_body(body, ChatRequest, engine.context_len)
    state.check_model(req.model)
    template = state.chat_template()
    prompt = build_chat_prompt(template, req)
    ids = state.encode(prompt.text, special=False, param="messages")
    max_tokens = reply_budget(len(ids), req.reply_limit, engine.context_len, "messages")
    top = (req.top_logprobs or 0) if req.logprobs else None
    params = sampling_params(
        req,
        engine.generation_defaults,
        max_tokens=max_tokens,
        logprobs=top,
        vocab_size=state.vocab_size,
    )
    reply = _ChatReply(state, req, prompt, f"chatcmpl-{secrets.token_hex(12)}", params.seed)
    # where each message ends: the engine keeps prompt states there, so a conversation that
    # shares this one's first messages, or extends it by a turn, resumes from them
    ends = message_ends(
        template, req, ids, lambda text: state.encode(text, special=False, param="messages")
    )
    return _ChatJob(req, reply, ids, params, ends)


class _ChatReply:
    """Builds the response for one chat request from its run."""

    def __init__(
        self, state: ServerState, req: ChatRequest, prompt: ChatPrompt, rid: str, seed: int
    ) -> None:
        self.state, self.req, self.prompt = state, req, prompt
        self.id, self.seed, self.created = rid, seed, int(time.time())
        self.top = (req.top_logprobs or 0) if req.logprobs else None
        self.num_tool_calls = 0

    def _head(self, kind: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.state.model_name,
            "seed": self.seed,
        }

    def _logprobs(self, ids: list[int], entries: list[dict[int, float]] | None) -> Any:
        if self.top is None or entries is None:
            return None
        return {"content": chat_logprobs(self.state.token_text, ids, entries, self.top)}

    def _tool_calls(self, delta: ReplyDelta, streaming: bool) -> list[dict[str, Any]]:
        calls = []
        for call in delta.tool_calls:
            item = {
                "id": f"call_{secrets.token_hex(12)}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            if streaming:
                item["index"] = self.num_tool_calls
            self.num_tool_calls += 1
            calls.append(item)
        return calls

    def _finish(self, out: RequestOutput) -> str:
        if out.finish_reason == FinishReason.STOP and self.num_tool_calls:
            return "tool_calls"
        return finish_reason(out)

    def _usage(self, out: RequestOutput, parser: ReplyParser) -> dict[str, Any]:
        return usage(out, reasoning_tokens=self.state.reasoning_tokens(out.token_ids, parser))

    def whole(self, out: RequestOutput) -> dict[str, Any]:
        if out.finish_reason == FinishReason.ERROR:
            raise ApiError(500, out.error or "the engine failed", type="server_error")
        parser = self.prompt.parser()
        delta = parser.feed(out.text)
        delta.extend(parser.finish())
        message: dict[str, Any] = {"role": "assistant", "content": delta.content or None}
        if parser.had_reasoning:
            message["reasoning_content"] = delta.reasoning
        if delta.tool_calls:
            message["tool_calls"] = self._tool_calls(delta, streaming=False)
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": self._finish(out),
            "logprobs": self._logprobs(out.token_ids, out.logprobs),
        }
        return {
            **self._head("chat.completion"),
            "choices": [choice],
            "usage": self._usage(out, parser),
        }

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        chunk = {**self._head("chat.completion.chunk"), "choices": [choice]}
        if self.req.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    async def events(self, run: ReplyRun) -> AsyncIterator[str]:
        parser = self.prompt.parser()
        yield self._chunk({"role": "assistant", "content": ""})
        async for piece in run.pieces():
            out = piece.output
            if out.finish_reason == FinishReason.ERROR:
                raise ApiError(500, out.error or "the engine failed", type="server_error")
            delta = parser.feed(piece.text)
            if piece.finished:
                delta.extend(parser.finish())
            logprobs = self._logprobs(piece.token_ids, piece.logprobs)
            if delta or (logprobs and logprobs["content"]):
                yield self._chunk(self._delta(delta), logprobs=logprobs)
            if piece.finished:
                yield self._chunk({}, finish=self._finish(out))
                if self.req.include_usage:
                    yield sse(
                        {
                            **self._head("chat.completion.chunk"),
                            "choices": [],
                            "usage": self._usage(out, parser),
                        }
                    )

    def _delta(self, delta: ReplyDelta) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if delta.reasoning:
            out["reasoning_content"] = delta.reasoning
        if delta.content:
            out["content"] = delta.content
        if delta.tool_calls:
            out["tool_calls"] = self._tool_calls(delta, streaming=True)
        return out
