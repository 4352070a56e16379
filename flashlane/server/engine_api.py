"""What the HTTP server needs from an engine: the contract between server/ and the engine thread.

The server never touches the model; it renders prompts, validates requests, and turns the
engine's cumulative snapshots into OpenAI responses. Tests drive it with a fake engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import tokenizers

    from flashlane.request import RequestOutput, SamplingParams


class QueueFull(Exception):
    """The engine's wait queue (--max-queue) is full; the server answers 429."""


class EngineFailed(RuntimeError):
    """The engine has failed and serves nothing more; the server answers 503 and exits."""


# One entry per token: id -> logprob for the token itself and the most likely alternatives.
TokenLogprobs = dict[int, float]


class EngineLike(Protocol):
    """The engine as the server sees it.

    stats() keys the server exports (missing ones are skipped): sessions_busy, sessions_total,
    queue (requests waiting), rounds, drafted, accepted (draft tokens, cumulative),
    prompt_cache_hits, prompt_cache_queries, prompt_cache_hit_tokens, prompt_cache_bytes,
    prompt_cache_capacity_bytes, moves, pauses; any other numeric key is exported as a gauge
    named flashlane_engine_<key>.
    """

    tokenizer: tokenizers.Tokenizer | None  # None: the checkpoint has none (token ids only)
    model_name: str
    context_len: int  # the most prompt + reply tokens one request may hold
    generation_defaults: dict[str, Any]  # the checkpoint's generation_config.json
    chat_template: str | None  # jinja source: chat_template.jinja or tokenizer_config.json
    eos_token_ids: list[int]
    # None while the engine serves; set once, never cleared, when it has failed: every request
    # in flight has then ended with finish_reason "error", and stream() raises EngineFailed.
    # Read with getattr(engine, "error", None): engines without the attribute never fail.
    error: str | None

    def stream(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str,
        boundaries: Sequence[int] = (),
    ) -> AsyncIterator[RequestOutput]:
        """Cumulative snapshots of one reply: token_ids and text so far (the text cut where a
        stop string starts), the last one with finish_reason set. Raises QueueFull (429) or
        ValueError (400), when called or at the first step, if the request cannot be taken.
        An error of the request ends it with finish_reason "error" and RequestOutput.error.
        Closing the iterator early (client gone, timeout) must abort the request.
        `boundaries`: token offsets where the prompt's chat messages end; they only decide
        where the prompt cache keeps states (marks), never the reply."""
        ...

    def abort(self, request_id: str) -> None:
        """Ends the request at the next round (or before it starts): its stream then ends with a
        snapshot whose finish_reason is "abort". Unknown or finished ids are ignored."""
        ...

    def stats(self) -> dict[str, float]:
        """Counters and gauges for /metrics; called on the event loop, so it must be cheap."""
        ...

    def prompt_logprobs(
        self, ids: list[int], top: int
    ) -> Awaitable[list[TokenLogprobs | None]] | list[TokenLogprobs | None]:
        """For each prompt token, its logprob given the tokens before it and the `top` most
        likely alternatives (None for the first token). Awaitable, or run in a worker thread
        by the server when it returns a plain list."""
        ...


class EngineSlot:
    """The engine an app serves. It starts empty while the engine loads (/health answers 503)
    and is set once; `failed` records a load that did not succeed."""

    def __init__(self, engine: EngineLike | None = None) -> None:
        self.engine = engine
        self.failed: str | None = None
        self.draining = False  # SIGTERM: no new requests; live streams finish

    def set(self, engine: EngineLike) -> None:
        self.engine = engine

    def fail(self, message: str) -> None:
        self.failed = message
