"""The app's state: the engine (once loaded), its compiled chat template, metrics, settings."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flashlane.request import FinishReason, RequestOutput, SamplingParams, SeedSource
from flashlane.server.chat import ChatTemplate
from flashlane.server.engine_api import EngineLike, EngineSlot, TokenLogprobs
from flashlane.server.generate import ReplyRun, engine_failed
from flashlane.server.logprobs import TokenText
from flashlane.server.metrics import ServerMetrics
from flashlane.server.protocol import ApiError
from flashlane.server.reply import THINK_END, TOOL_END, TOOL_START, ReplyParser

T = TypeVar("T")

# Threads that decode, validate, render and tokenize requests: off the event loop, and few,
# so a flood of large bodies queues here instead of taking the GIL from the engine thread.
PREP_THREADS = 2


@dataclass
class ServerState:
    slot: EngineSlot
    api_keys: tuple[str, ...] = ()
    served_model_name: str | None = None
    max_body_bytes: int = 32 * 2**20
    request_timeout: float | None = None  # seconds from arrival to the last token
    metrics: ServerMetrics | None = None
    # set by attach(), before the engine becomes visible in `slot`
    _template: ChatTemplate | None = None
    _template_error: str | None = None
    token_text: TokenText = field(init=False)
    vocab_size: int = 0
    think_end_id: int | None = None
    live_runs: set[ReplyRun] = field(default_factory=set)
    # seeds of requests without one: the engine's (--seed S gives S, S + 1, ...) or random
    seeds: SeedSource = field(default_factory=SeedSource)
    # the engine's chat_template_kwargs, under each request's own
    template_defaults: dict[str, Any] = field(default_factory=dict)
    # characters of the longest token: a text longer than context x this cannot fit
    longest_token_chars: int = 1
    prep: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(PREP_THREADS, thread_name_prefix="prep")
    )

    def attach(self, engine: EngineLike) -> None:
        """Prepares everything that depends on the engine, then publishes it."""
        self.metrics = ServerMetrics(self.served_model_name or engine.model_name)
        self.metrics.watch_engine(engine.stats)
        self.seeds = getattr(engine, "seeds", None) or SeedSource()
        self.template_defaults = dict(getattr(engine, "chat_template_kwargs", None) or {})
        tokenizer = engine.tokenizer
        self.token_text = TokenText(tokenizer)
        if tokenizer is not None:
            self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
            # a model built with fewer rows than its tokenizer's words (`serve
            # --random-weights` of a small config) embeds only its own
            rows = getattr(engine, "model_vocab_size", None)
            self.vocab_size = min(self.vocab_size, rows) if rows else self.vocab_size
            self.think_end_id = tokenizer.token_to_id(THINK_END)
            self.longest_token_chars = _longest_token_chars(tokenizer, self.vocab_size)
        else:
            self.vocab_size = 2**31  # the model checks ids it cannot embed
        if engine.chat_template and tokenizer is not None:
            eos = [tokenizer.id_to_token(i) for i in engine.eos_token_ids[:1]]
            special = {"eos_token": (eos[0] or "") if eos else "", "bos_token": ""}
            try:
                self._template = ChatTemplate(engine.chat_template, special)
            except ValueError as e:
                self._template_error = str(e)
        self.slot.set(engine)

    @property
    def model_name(self) -> str:
        engine = self.slot.engine
        return self.served_model_name or (engine.model_name if engine else "")

    def engine(self) -> EngineLike:
        """The engine for a new request, or 503 while loading, after a failed load, or draining."""
        if self.slot.draining:
            raise ApiError(
                503, "the server is shutting down", type="service_unavailable", code="shutting_down"
            )
        engine = self.slot.engine
        if engine is not None and getattr(engine, "error", None):
            raise engine_failed(engine.error)
        if engine is None:
            msg = f"the model failed to load: {self.slot.failed}" if self.slot.failed else None
            raise ApiError(
                503,
                msg or "the model is still loading",
                type="service_unavailable",
                code="model_not_ready",
            )
        return engine

    def check_model(self, model: str | None) -> None:
        engine = self.slot.engine
        names = {self.model_name, engine.model_name if engine else ""}
        if model and model not in names:
            raise ApiError(
                404,
                f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                param="model",
                code="model_not_found",
            )

    def template_kwargs(self, given: dict[str, Any] | None) -> dict[str, Any] | None:
        """A request's chat_template_kwargs over the engine's defaults."""
        if not self.template_defaults:
            return given
        return {**self.template_defaults, **(given or {})}

    def chat_template(self) -> ChatTemplate:
        if self._template is None:
            msg = self._template_error or "the model has no chat template; use /v1/completions"
            raise ApiError(400, msg, param="messages")
        return self._template

    async def offload(self, fn: Callable[..., T], *args: Any) -> T:
        """Runs `fn(*args)` on a prep thread: parsing, rendering and tokenizing a large request
        would stall every stream if it ran on the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.prep, functools.partial(fn, *args))

    def encode(self, text: str, *, special: bool, param: str) -> list[int]:
        """Token ids of a text prompt; 400 when the checkpoint has no tokenizer.json, and
        `context_length_exceeded` for a text too long to fit whatever it holds, before any of
        it is tokenized. Call it on a prep thread: encode_batch gives the GIL up while it
        runs (encode holds it, seconds for a long text)."""
        engine = self.engine()
        tokenizer = engine.tokenizer
        if tokenizer is None:
            raise ApiError(400, "this model has no tokenizer: send token ids", param=param)
        limit = engine.context_len * self.longest_token_chars
        if len(text) > limit:
            msg = (
                f"This model's maximum context length is {engine.context_len} tokens, and no "
                f"token is longer than {self.longest_token_chars} characters; the prompt holds "
                f"{len(text)} characters. Shorten the prompt."
            )
            raise ApiError(400, msg, param=param, code="context_length_exceeded")
        return tokenizer.encode_batch([text], add_special_tokens=special)[0].ids

    def tag_ids(self) -> dict[str, int | None]:
        """The tool-call tags' token ids (None where the vocabulary has no such token)."""
        tokenizer = self.engine().tokenizer
        tags = (TOOL_START, TOOL_END)
        return {t: tokenizer.token_to_id(t) if tokenizer is not None else None for t in tags}

    def decode(self, ids: list[int]) -> str:
        tokenizer = self.engine().tokenizer
        return "" if tokenizer is None else tokenizer.decode(ids, skip_special_tokens=False)

    def new_run(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        boundaries: Sequence[int] = (),
    ) -> ReplyRun:
        """A reply to run; `boundaries`: where the prompt's chat messages end (cache marks)."""
        assert self.metrics is not None
        engine = self.engine()
        return ReplyRun(
            engine,
            self.metrics,
            prompt_ids,
            params,
            request_id,
            timeout=self.request_timeout,
            live=self.live_runs,
            boundaries=boundaries,
        )

    def cancel_live(self) -> None:
        """Asks the engine to end every reply in flight; each stream then ends with
        finish_reason "abort" (the end of a drain)."""
        for run in list(self.live_runs):
            run.engine.abort(run.request_id)

    def reasoning_tokens(self, token_ids: list[int], parser: ReplyParser) -> int:
        """Reply tokens up to and including "</think>", all of them while still thinking."""
        if not parser.had_reasoning:
            return 0
        if self.think_end_id is not None and self.think_end_id in token_ids:
            return token_ids.index(self.think_end_id) + 1
        return len(token_ids) if parser.in_reasoning else 0

    async def prompt_logprobs(self, ids: list[int], top: int) -> list[TokenLogprobs | None]:
        """The engine's prompt logprobs, off the event loop when its method is synchronous."""
        engine = self.engine()
        result: Any = await asyncio.to_thread(engine.prompt_logprobs, ids, top)
        if inspect.isawaitable(result):
            result = await result
        return list(result)


def _longest_token_chars(tokenizer: Any, vocab_size: int) -> int:
    """Characters of the longest token's text (a token of partial UTF-8 bytes counts as the
    one character it stands in for), plus one: a decoder may strip the space a token starts
    with when it decodes alone."""
    ids = list(range(vocab_size))
    texts = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return 1 + max([0, *(len(t) for t in texts)])


def finish_reason(out: RequestOutput) -> str:
    reason = out.finish_reason
    return FinishReason(reason).value if reason is not None else "abort"


def usage(out: RequestOutput | None, *, reasoning_tokens: int = 0, prompt: int = 0) -> dict:
    """OpenAI usage for one reply (or only a prompt, when `out` is None)."""
    num_prompt = len(out.prompt_token_ids) if out is not None else prompt
    completion = len(out.token_ids) if out is not None else 0
    cached = out.stats.cached_tokens if out is not None else 0
    return {
        "prompt_tokens": num_prompt,
        "completion_tokens": completion,
        "total_tokens": num_prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": reasoning_tokens},
    }
