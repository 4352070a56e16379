"""One reply from the engine, as the HTTP layer needs it: sampling params from a request, the
context check, and `ReplyRun`, which turns cumulative snapshots into pieces to send.

Everything that can refuse a request (params, context, token ids) runs before the engine is
called, so a 4xx never touches engine state.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from flashlane.detok import StopMatcher
from flashlane.request import (
    SEED_MODULUS,
    FinishReason,
    RequestOutput,
    SamplingParams,
    SeedSource,
    StructuredOutput,
)
from flashlane.server.engine_api import EngineFailed, EngineLike, QueueFull, TokenLogprobs
from flashlane.server.metrics import ServerMetrics
from flashlane.server.protocol import ApiError, SamplingFields
from flashlane.sessions.slots import NoSessionFits

# Request fields filled from generation_config.json when a request leaves them out.
_DEFAULTED = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


def sampling_params(
    req: SamplingFields,
    defaults: dict[str, Any],
    *,
    max_tokens: int,
    logprobs: int | None,
    vocab_size: int,
    seeds: SeedSource | None = None,
    structured: StructuredOutput | None = None,
) -> SamplingParams:
    """The engine's params for a request; omitted sampling fields come from `defaults`, an
    omitted seed from `seeds` (the engine's --seed; fresh random ones without it)."""
    kwargs: dict[str, Any] = {}
    for name in _DEFAULTED:
        value = getattr(req, name)
        if value is None:
            value = defaults.get(name)
        if value is not None:
            kwargs[name] = value
    # transformers' do_sample=False means greedy unless the request asks otherwise
    if req.temperature is None and defaults.get("do_sample") is False:
        kwargs["temperature"] = 0.0
    if kwargs.get("top_k") == -1:
        kwargs["top_k"] = 0
    bias = {int(k): v for k, v in (req.logit_bias or {}).items()}
    check_token_ids(list(bias), vocab_size, "logit_bias")
    check_token_ids(req.stop_token_ids or [], vocab_size, "stop_token_ids")
    try:
        return SamplingParams(
            **kwargs,
            max_tokens=max_tokens,
            seed=(seeds or SeedSource()).next(req.seed),
            logit_bias=bias or None,
            stop=req.stop_list or None,
            stop_token_ids=req.stop_token_ids,
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            draft=req.draft,
            thinking_budget=req.thinking_budget,
            structured=structured,
        )
    except (ValueError, TypeError) as e:
        raise ApiError(400, str(e)) from None


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """The params of each of a request's n choices: choice j draws with (seed + j) modulo
    2**63 (DESIGN.md section 5), so it equals a single request sent with that seed."""
    return [
        dataclasses.replace(params, n=1, seed=(params.seed + j) % SEED_MODULUS) for j in range(n)
    ]


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ApiError(
            400, f"token id {bad[0]} is outside the vocabulary (0..{vocab_size - 1})", param=param
        )


def reply_budget(
    num_prompt: int, asked: int | None, context_len: int, param: str, default: int | None = None
) -> int:
    """max_tokens for a prompt: the request's; else `default` (generation_config.json's
    max_new_tokens, as vLLM reads it) or what the context leaves, whichever is less. A prompt
    that does not fit is `context_length_exceeded`."""
    if num_prompt == 0:
        raise ApiError(400, "the prompt is empty", param=param)
    room = context_len - num_prompt
    if room < 1 or (asked is not None and asked > room):
        wanted = f"{num_prompt} in the prompt" + (f" and {asked} to generate" if asked else "")
        msg = (
            f"This model's maximum context length is {context_len} tokens; the request needs "
            f"{num_prompt + (asked or 1)} ({wanted}). Shorten the prompt or lower max_tokens."
        )
        raise ApiError(400, msg, param=param, code="context_length_exceeded")
    if asked is not None:
        return asked
    return room if default is None else min(default, room)


def default_max_tokens(defaults: dict[str, Any]) -> int | None:
    """generation_config.json's max_new_tokens, the reply budget of a request without one."""
    value = defaults.get("max_new_tokens")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def engine_failed(message: str) -> ApiError:
    """503: the engine has failed; the server is exiting so that a supervisor restarts it."""
    return ApiError(503, message, type="service_unavailable", code="engine_failed")


@dataclass(slots=True)
class Piece:
    """What one snapshot adds to a reply."""

    text: str  # newly final text (stop-string prefixes held back until decided)
    token_ids: list[int]  # new tokens
    logprobs: list[TokenLogprobs] | None  # one per new token, when asked for
    output: RequestOutput  # the snapshot itself

    @property
    def finished(self) -> bool:
        return self.output.finish_reason is not None


class ReplyRun:
    """One engine stream. `start` waits for the first snapshot (a full queue is a 429 before any
    response is sent); `pieces` yields the rest; `close` aborts it if the client left early."""

    def __init__(
        self,
        engine: EngineLike,
        metrics: ServerMetrics,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        *,
        timeout: float | None = None,
        live: set[ReplyRun] | None = None,
        boundaries: Sequence[int] = (),
    ) -> None:
        self.engine, self.metrics = engine, metrics
        self.boundaries = list(boundaries)  # where chat messages end: prompt-cache marks
        self._live = live if live is not None else set()  # the app's runs in flight
        self.prompt_ids, self.params, self.request_id = prompt_ids, params, request_id
        self._stops = StopMatcher(params.stop)
        self._sent_text = 0
        self._sent_tokens = 0
        self._arrival = time.perf_counter()
        self._deadline = None if timeout is None else self._arrival + timeout
        self._first_token: float | None = None
        self._last_token: float | None = None  # when the latest tokens arrived
        self._iter: AsyncIterator[RequestOutput] | None = None
        self._next: RequestOutput | None = None
        self.last: RequestOutput | None = None
        self.done = False  # nothing left to abort or record
        self.ended: str | None = None  # the finish reason recorded in the metrics
        self._in_flight = False  # started and not yet recorded

    async def start(self) -> None:
        self.metrics.in_flight.inc()
        self._in_flight = True
        self._live.add(self)
        try:
            stream = self.engine.stream(
                self.prompt_ids, self.params, self.request_id, boundaries=self.boundaries
            )
            self._iter = aiter(stream)
            self._next = await self._advance()
        except QueueFull:
            self._leave()
            msg = "the engine's queue is full; retry later"
            retry = {"Retry-After": "1"}  # a queue slot frees as soon as any reply ends
            raise ApiError(
                429, msg, type="rate_limit_error", code="queue_full", headers=retry
            ) from None
        except EngineFailed as e:
            self._leave()
            raise engine_failed(str(e)) from None
        except NoSessionFits as e:
            self._leave()
            raise ApiError(400, str(e), code="context_length_exceeded") from None
        except ValueError as e:
            self._leave()
            raise ApiError(400, str(e)) from None

    def _leave(self) -> None:
        self.done = True
        if self._in_flight:
            self._in_flight = False
            self.metrics.in_flight.dec()
            self._live.discard(self)

    async def pieces(self) -> AsyncIterator[Piece]:
        assert self._iter is not None, "start() first"
        while self._next is not None:
            out, self._next = self._next, None
            piece = self._piece(out)
            if piece.finished:
                self._record(out, str(FinishReason(out.finish_reason).value))
            yield piece
            if not piece.finished:
                self._next = await self._advance()
        if not self.done:
            # the engine's stream ended without a finish reason: count it as an error
            self._record(self.last, FinishReason.ERROR.value)
            raise ApiError(500, "the engine ended the reply early", type="server_error")

    async def _advance(self) -> RequestOutput | None:
        """The next snapshot; past the deadline, the request is aborted and answered 408."""
        assert self._iter is not None
        if self._deadline is None:
            return await anext(self._iter, None)
        try:
            left = self._deadline - time.perf_counter()
            return await asyncio.wait_for(anext(self._iter, None), max(left, 0.0))
        except asyncio.TimeoutError:
            self.close()
            raise ApiError(
                408,
                "the request took longer than the server's --request-timeout",
                type="timeout_error",
                code="request_timeout",
            ) from None

    def _piece(self, out: RequestOutput) -> Piece:
        self.last = out
        now = time.perf_counter()
        if out.token_ids and self._first_token is None:
            self._first_token = now
        num_new = len(out.token_ids) - self._sent_tokens
        if num_new > 0 and self._last_token is not None:
            self.metrics.tokens_arrived(now - self._last_token, num_new)
        if num_new > 0:
            self._last_token = now
        if out.finish_reason is not None:
            visible = len(out.text)
        else:
            visible = max(self._sent_text, self._stops.check(out.text).visible)
        text = out.text[self._sent_text : visible]
        new_ids = out.token_ids[self._sent_tokens :]
        logprobs = None
        if out.logprobs is not None:
            logprobs = out.logprobs[self._sent_tokens : len(out.token_ids)]
        self._sent_text, self._sent_tokens = visible, len(out.token_ids)
        return Piece(text, new_ids, logprobs, out)

    def _record(self, out: RequestOutput | None, reason: str) -> None:
        self._leave()
        self.ended = reason
        now = time.perf_counter()
        ttft = None if self._first_token is None else self._first_token - self._arrival
        self.metrics.finished(
            reason=reason,
            prompt_tokens=len(self.prompt_ids),
            cached_tokens=out.stats.cached_tokens if out is not None else 0,
            generation_tokens=len(out.token_ids) if out is not None else 0,
            ttft=ttft,
            e2e=now - self._arrival,
            phases=None
            if out is None
            else (out.stats.queue_seconds, out.stats.prefill_seconds, out.stats.decode_seconds),
        )

    def close(self) -> None:
        """Aborts the engine request unless it finished (client gone, timeout, server error)."""
        if self._in_flight:
            self.engine.abort(self.request_id)
            self._record(self.last, FinishReason.ABORT.value)
        self.done = True

    def summary(self) -> str:
        """For the request log: tokens in and out, why it ended, time to first token."""
        out = self.last
        reason = self.ended or "-"
        ttft = "-" if self._first_token is None else f"{self._first_token - self._arrival:.3f}s"
        num_reply = len(out.token_ids) if out is not None else 0
        return f"prompt={len(self.prompt_ids)} reply={num_reply} finish={reason} ttft={ttft}"

    async def run(self) -> RequestOutput:
        """The whole reply (non-streaming)."""
        async for _ in self.pieces():
            pass
        assert self.last is not None
        return self.last


async def merged_pieces(runs: list[tuple[int, ReplyRun]]) -> AsyncIterator[tuple[int, Piece]]:
    """The pieces of all runs as they come, tagged with their choice index."""
    if len(runs) == 1:
        index, run = runs[0]
        async for piece in run.pieces():
            yield index, piece
        return
    queue: asyncio.Queue[tuple[int, Piece | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, run: ReplyRun) -> None:
        try:
            async for piece in run.pieces():
                await queue.put((index, piece))
            await queue.put((index, None))
        except Exception as e:
            await queue.put((index, e))

    tasks = [asyncio.ensure_future(pump(i, r)) for i, r in runs]
    try:
        left = len(tasks)
        while left:
            index, item = await queue.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
