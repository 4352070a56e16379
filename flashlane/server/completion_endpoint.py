"""POST /v1/completions: text or token-id prompts (one or a batch), echo, prompt logprobs."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from flashlane.request import FinishReason, RequestOutput, StructuredOutput
from flashlane.server.body import parse_body
from flashlane.server.generate import (
    ReplyRun,
    check_token_ids,
    choice_params,
    default_max_tokens,
    merged_pieces,
    reply_budget,
    sampling_params,
)
from flashlane.server.logprobs import completion_logprobs, merge_columns
from flashlane.server.protocol import ApiError, CompletionRequest
from flashlane.server.state import ServerState, finish_reason, usage
from flashlane.server.structured import request_structured
from flashlane.server.transport import (
    EventStream,
    guarded_events,
    read_body,
    sse,
    until_disconnect,
)


@dataclass(slots=True)
class _Choice:
    """One prompt of the batch and its reply."""

    index: int
    prompt_ids: list[int]
    prompt_text: str
    run: ReplyRun | None  # None: max_tokens 0 with echo, nothing to generate
    echo_logprobs: dict[str, list[Any]] | None = None  # the prompt's columns, for echo
    offset: int = 0  # characters of the choice's text sent so far
    sent_prompt_ids: bool = False  # return_token_ids: the prompt's ids went out (streamed)


async def completions(request: Request) -> Response:
    state: ServerState = request.app.state.flashlane
    state.engine()  # 503 before anything else while loading or draining
    body = await read_body(request, state.max_body_bytes)
    rid = f"cmpl-{secrets.token_hex(12)}"
    req, choices = await until_disconnect(request, state.offload(_prepare_all, state, body, rid))
    runs = [c.run for c in choices if c.run is not None]
    request.state.reply_id, request.state.runs = rid, runs
    try:
        for choice in choices:
            await until_disconnect(request, _start(state, req, choice))
        reply = _CompletionReply(state, req, rid, choices)
        if req.stream:
            return EventStream(
                guarded_events(reply.events(), reply.id), on_close=lambda: _close(runs)
            )
        outs = await until_disconnect(request, asyncio.gather(*(r.run() for r in runs)))
    except BaseException:
        _close(runs)
        raise
    return JSONResponse(reply.whole(list(outs)))


def _prepare_all(
    state: ServerState, body: bytes, rid: str
) -> tuple[CompletionRequest, list[_Choice]]:
    """Parse the request and tokenize its prompts (a prep thread's work)."""
    req = parse_body(body, CompletionRequest, state.engine().context_len)
    state.check_model(req.model)
    structured = request_structured(req)
    choices = [
        choice
        for i, prompt in enumerate(req.prompts)
        for choice in _prepare(state, req, prompt, rid, i * req.n, structured)
    ]
    return req, choices


def _close(runs: list[ReplyRun]) -> None:
    for run in runs:
        run.close()


def _prepare(
    state: ServerState,
    req: CompletionRequest,
    prompt: str | list[int],
    rid: str,
    index: int,
    structured: StructuredOutput | None,
) -> list[_Choice]:
    """Tokenises and validates one prompt; its n choices from `index` on (OpenAI's order:
    prompt by prompt, each prompt's choices together); nothing reaches the engine yet."""
    engine = state.engine()
    if req.suffix is not None:
        prompt = fill_in_the_middle(state, prompt, req.suffix)
    if isinstance(prompt, str):
        ids = state.encode(prompt, special=True, param="prompt")
        text = prompt
    else:
        check_token_ids(prompt, state.vocab_size, "prompt")
        ids, text = prompt, state.decode(prompt)
    asked = req.max_tokens if req.max_tokens else None
    max_tokens = reply_budget(
        len(ids),
        asked,
        engine.context_len,
        "prompt",
        default=default_max_tokens(engine.generation_defaults),
    )
    if req.max_tokens == 0:
        return [_Choice(index + j, ids, text, None) for j in range(req.n)]
    params = sampling_params(
        req,
        engine.generation_defaults,
        max_tokens=max_tokens,
        logprobs=req.logprobs,
        vocab_size=state.vocab_size,
        seeds=state.seeds,
        structured=structured,
    )
    return [
        _Choice(index + j, ids, text, state.new_run(ids, p, f"{rid}-{index + j}"))
        for j, p in enumerate(choice_params(params, req.n))
    ]


# Qwen2.5-Coder's, StarCoder's and most code models' fill-in-the-middle tokens
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


def fill_in_the_middle(state: ServerState, prompt: str | list[int], suffix: str) -> str:
    """The prompt that asks for the text between `prompt` and `suffix` (prefix-suffix-middle
    order), where the tokenizer defines the FIM tokens; else a 400 saying so."""
    tokenizer = state.engine().tokenizer
    if tokenizer is None or any(tokenizer.token_to_id(t) is None for t in FIM_TOKENS):
        msg = "suffix needs fill-in-the-middle, and this model's tokenizer defines no " + ", ".join(
            FIM_TOKENS
        )
        raise ApiError(400, msg, param="suffix")
    if not isinstance(prompt, str):
        raise ApiError(400, "suffix needs a text prompt, not token ids", param="suffix")
    prefix, hole, middle = FIM_TOKENS
    return f"{prefix}{prompt}{hole}{suffix}{middle}"


async def _start(state: ServerState, req: CompletionRequest, choice: _Choice) -> None:
    if req.echo and req.logprobs is not None:
        entries = await state.prompt_logprobs(choice.prompt_ids, req.logprobs)
        choice.echo_logprobs = completion_logprobs(
            state.token_text, choice.prompt_ids, entries, req.logprobs
        )
    if choice.run is not None:
        await choice.run.start()


class _CompletionReply:
    def __init__(
        self, state: ServerState, req: CompletionRequest, rid: str, choices: list[_Choice]
    ) -> None:
        self.state, self.req, self.id, self.choices = state, req, rid, choices
        self.created = int(time.time())
        runs = [c.run for c in choices if c.run is not None]
        self.seed = runs[0].params.seed if runs else None

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.state.model_name,
            "seed": self.seed,
        }

    def _columns(self, choice: _Choice, ids: list[int], entries: Any) -> dict[str, list[Any]]:
        if self.req.logprobs is None or entries is None:
            return {}
        cols = completion_logprobs(
            self.state.token_text, ids, entries, self.req.logprobs, offset=choice.offset
        )
        return cols

    def _usage(self, outs: list[RequestOutput | None]) -> dict[str, Any]:
        total: dict[str, Any] = usage(None)
        for choice, out in zip(self.choices, outs):
            one = usage(out, prompt=len(choice.prompt_ids))
            # a prompt counts once, however many choices it has (OpenAI's usage)
            first = choice.index % self.req.n == 0
            total["prompt_tokens"] += one["prompt_tokens"] if first else 0
            total["completion_tokens"] += one["completion_tokens"]
            total["prompt_tokens_details"]["cached_tokens"] += (
                one["prompt_tokens_details"]["cached_tokens"] if first else 0
            )
        total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
        return total

    def whole(self, outs: list[RequestOutput]) -> dict[str, Any]:
        by_choice: list[RequestOutput | None] = []
        answers = []
        it = iter(outs)
        for choice in self.choices:
            out = next(it) if choice.run is not None else None
            by_choice.append(out)
            if out is not None and out.finish_reason == FinishReason.ERROR:
                raise ApiError(500, out.error or "the engine failed", type="server_error")
            text = choice.prompt_text if self.req.echo else ""
            choice.offset = len(text)
            cols = choice.echo_logprobs or {}
            if out is not None:
                reply_cols = self._columns(choice, out.token_ids, out.logprobs)
                cols = (
                    merge_columns(cols, reply_cols) if cols and reply_cols else cols or reply_cols
                )
                text += out.text
            answer = {
                "index": choice.index,
                "text": text,
                "logprobs": cols or None,
                "finish_reason": finish_reason(out) if out else "length",
            }
            if self.req.return_token_ids:
                answer["prompt_token_ids"] = list(choice.prompt_ids)
                answer["token_ids"] = list(out.token_ids) if out is not None else []
            answers.append(answer)
        return {**self._head(), "choices": answers, "usage": self._usage(by_choice)}

    def _chunk(
        self,
        index: int,
        text: str,
        cols: Any,
        finish: str | None,
        token_ids: list[int] | None = None,
    ) -> str:
        choice = {"index": index, "text": text, "logprobs": cols or None, "finish_reason": finish}
        if self.req.return_token_ids:
            mine = self.choices[index]
            if not mine.sent_prompt_ids:
                choice["prompt_token_ids"] = list(mine.prompt_ids)
                mine.sent_prompt_ids = True
            choice["token_ids"] = list(token_ids or [])
        chunk = {**self._head(), "choices": [choice]}
        if self.req.include_usage:
            chunk["usage"] = None
        return sse(chunk)

    async def events(self) -> AsyncIterator[str]:
        outs: list[RequestOutput | None] = [None] * len(self.choices)
        for choice in self.choices:
            if self.req.echo:
                choice.offset = len(choice.prompt_text)
                finish = "length" if choice.run is None else None
                yield self._chunk(choice.index, choice.prompt_text, choice.echo_logprobs, finish)
        runs = [(c.index, c.run) for c in self.choices if c.run is not None]
        async for index, piece in merged_pieces(runs):
            choice = self.choices[index]
            out = piece.output
            if out.finish_reason == FinishReason.ERROR:
                raise ApiError(500, out.error or "the engine failed", type="server_error")
            cols = self._columns(choice, piece.token_ids, piece.logprobs)
            choice.offset += len(piece.text)
            finish = finish_reason(out) if piece.finished else None
            ids = piece.token_ids if self.req.return_token_ids else []
            if piece.text or cols or finish or ids:
                yield self._chunk(index, piece.text, cols, finish, ids)
            if piece.finished:
                outs[index] = out
        if self.req.include_usage:
            yield sse({**self._head(), "choices": [], "usage": self._usage(outs)})
