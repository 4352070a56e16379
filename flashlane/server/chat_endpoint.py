"""POST /v1/chat/completions: render, run, and answer as JSON or as SSE chunks."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from flashlane.request import FinishReason, RequestOutput
from flashlane.server.body import parse_body
from flashlane.server.chat import ChatPrompt, build_chat_prompt, message_ends
from flashlane.server.engine_api import EngineLike
from flashlane.server.generate import (
    ReplyRun,
    choice_params,
    default_max_tokens,
    merged_pieces,
    reply_budget,
    sampling_params,
)
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
    rid = f"chatcmpl-{secrets.token_hex(12)}"
    req, job = await until_disconnect(request, state.offload(_prepare, state, engine, body, rid))
    reply = _ChatReply(state, req, job.prompt, rid, job.seed)
    await start_runs(request, rid, job.runs)
    try:
        if req.stream:
            return EventStream(
                guarded_events(reply.events(job.runs), rid), on_close=lambda: close_runs(job.runs)
            )
        outs = await until_disconnect(request, asyncio.gather(*(r.run() for r in job.runs)))
    except BaseException:
        close_runs(job.runs)
        raise
    return JSONResponse(reply.whole(list(outs)))


@dataclass(frozen=True, slots=True)
class ChatJob:
    """A chat request made ready to run: its prompt, and one run per choice (not started)."""

    prompt: ChatPrompt
    prompt_ids: list[int]
    seed: int  # the request's seed; choice j draws with seed + j
    runs: list[ReplyRun]


def _prepare(
    state: ServerState, engine: EngineLike, body: bytes, rid: str
) -> tuple[ChatRequest, ChatJob]:
    """Parse a chat request's body and make it ready (a prep thread's work)."""
    req = parse_body(body, ChatRequest, engine.context_len)
    return req, prepare_chat(state, req, rid, (req.top_logprobs or 0) if req.logprobs else None)


def prepare_chat(state: ServerState, req: ChatRequest, rid: str, top: int | None) -> ChatJob:
    """Renders, tokenizes and checks a chat request (the chat, Anthropic and Responses
    endpoints all come here); every 4xx is raised before the engine sees anything. Run it on a
    prep thread (ServerState.offload): rendering and tokenizing a long chat takes seconds."""
    engine = state.engine()
    state.check_model(req.model)
    kwargs = state.template_kwargs(req.chat_template_kwargs)
    req = req.model_copy(update={"chat_template_kwargs": kwargs})
    template = state.chat_template()
    prompt = build_chat_prompt(template, req, state.tag_ids())
    ids = state.encode(prompt.text, special=False, param="messages")
    max_tokens = reply_budget(
        len(ids),
        req.reply_limit,
        engine.context_len,
        "messages",
        default=default_max_tokens(engine.generation_defaults),
    )
    params = sampling_params(
        req,
        engine.generation_defaults,
        max_tokens=max_tokens,
        logprobs=top,
        vocab_size=state.vocab_size,
        seeds=state.seeds,
        structured=prompt.structured,
    )
    # where each message ends: the engine keeps prompt states there, so a conversation that
    # shares this one's first messages, or extends it by a turn, resumes from them
    ends = message_ends(
        template, req, ids, lambda text: state.encode(text, special=False, param="messages")
    )
    runs = [
        state.new_run(ids, p, f"{rid}-{j}", boundaries=ends)
        for j, p in enumerate(choice_params(params, req.n))
    ]
    return ChatJob(prompt, ids, params.seed, runs)


async def start_runs(request: Request, rid: str, runs: list[ReplyRun]) -> None:
    """Starts every run (a full queue is a 429 before any response goes out)."""
    request.state.reply_id, request.state.runs = rid, runs
    try:
        for run in runs:
            await until_disconnect(request, run.start())
    except BaseException:
        close_runs(runs)
        raise


def close_runs(runs: list[ReplyRun]) -> None:
    for run in runs:
        run.close()


async def one_reply(
    request: Request,
    rid: str,
    job: ChatJob,
    stream: bool,
    events: Callable[[ReplyRun], AsyncIterator[str]],
) -> RequestOutput | EventStream:
    """Runs a one-choice job (the Anthropic and Responses endpoints): an EventStream of
    `events(run)` when streaming, else the finished output (checked)."""
    (run,) = job.runs
    await start_runs(request, rid, job.runs)
    try:
        if stream:
            return EventStream(events(run), on_close=lambda: close_runs(job.runs))
        out = await until_disconnect(request, run.run())
    except BaseException:
        close_runs(job.runs)
        raise
    return checked(out)


def checked(out: RequestOutput) -> RequestOutput:
    """The output, or a 500 when the engine failed its stream."""
    if out.finish_reason == FinishReason.ERROR:
        raise ApiError(500, out.error or "the engine failed", type="server_error")
    return out


class _ChatReply:
    """Builds the response for one chat request from its run."""

    def __init__(
        self, state: ServerState, req: ChatRequest, prompt: ChatPrompt, rid: str, seed: int
    ) -> None:
        self.state, self.req, self.prompt = state, req, prompt
        self.id, self.seed, self.created = rid, seed, int(time.time())
        self.top = (req.top_logprobs or 0) if req.logprobs else None
        self.num_tool_calls = [0] * req.n  # per choice

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

    def _tool_calls(self, index: int, delta: ReplyDelta, streaming: bool) -> list[dict[str, Any]]:
        calls = []
        for call in delta.tool_calls:
            item = {
                "id": f"call_{secrets.token_hex(12)}",
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            if streaming:
                item["index"] = self.num_tool_calls[index]
            self.num_tool_calls[index] += 1
            calls.append(item)
        return calls

    def _finish(self, index: int, out: RequestOutput) -> str:
        if out.finish_reason == FinishReason.STOP and self.num_tool_calls[index]:
            return "tool_calls"
        return finish_reason(out)

    def _usage(self, outs: list[RequestOutput], parsers: list[ReplyParser]) -> dict[str, Any]:
        """The first choice's usage, with every choice's reply tokens (the prompt counts once)."""
        total = usage(outs[0])
        for out in outs[1:]:
            total["completion_tokens"] += len(out.token_ids)
            total["total_tokens"] += len(out.token_ids)
        total["completion_tokens_details"]["reasoning_tokens"] = sum(
            self.state.reasoning_tokens(out.token_ids, parser) for out, parser in zip(outs, parsers)
        )
        return total

    def whole(self, outs: list[RequestOutput]) -> dict[str, Any]:
        choices, parsers = [], []
        for index, out in enumerate(outs):
            if out.finish_reason == FinishReason.ERROR:
                raise ApiError(500, out.error or "the engine failed", type="server_error")
            parser = self.prompt.parser()
            delta = parser.feed(out.text)
            delta.extend(parser.finish())
            message: dict[str, Any] = {"role": "assistant", "content": delta.content or None}
            if parser.had_reasoning:
                message["reasoning_content"] = delta.reasoning
            if delta.tool_calls:
                message["tool_calls"] = self._tool_calls(index, delta, streaming=False)
            choice = {
                "index": index,
                "message": message,
                "finish_reason": self._finish(index, out),
                "logprobs": self._logprobs(out.token_ids, out.logprobs),
            }
            choices.append(choice)
            parsers.append(parser)
        return {
            **self._head("chat.completion"),
            "choices": choices,
            "usage": self._usage(outs, parsers),
        }

    def _chunk(
        self, index: int, delta: dict[str, Any], finish: str | None = None, logprobs: Any = None
    ) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        chunk = {**self._head("chat.completion.chunk"), "choices": [choice]}
        if self.req.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    async def events(self, runs: list[ReplyRun]) -> AsyncIterator[str]:
        n = len(runs)
        parsers = [self.prompt.parser() for _ in runs]
        outs: list[RequestOutput | None] = [None] * n
        for index in range(n):
            yield self._chunk(index, {"role": "assistant", "content": ""})
        async for index, piece in merged_pieces(list(enumerate(runs))):
            out, parser = piece.output, parsers[index]
            if out.finish_reason == FinishReason.ERROR:
                raise ApiError(500, out.error or "the engine failed", type="server_error")
            delta = parser.feed(piece.text)
            if piece.finished:
                delta.extend(parser.finish())
            logprobs = self._logprobs(piece.token_ids, piece.logprobs)
            if delta or (logprobs and logprobs["content"]):
                yield self._chunk(index, self._delta(index, delta), logprobs=logprobs)
            if piece.finished:
                outs[index] = out
                yield self._chunk(index, {}, finish=self._finish(index, out))
        if self.req.include_usage and all(out is not None for out in outs):
            done = [out for out in outs if out is not None]
            body = {**self._head("chat.completion.chunk"), "choices": []}
            yield sse({**body, "usage": self._usage(done, parsers)})

    def _delta(self, index: int, delta: ReplyDelta) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if delta.reasoning:
            out["reasoning_content"] = delta.reasoning
        if delta.content:
            out["content"] = delta.content
        if delta.tool_calls:
            out["tool_calls"] = self._tool_calls(index, delta, streaming=True)
        return out
