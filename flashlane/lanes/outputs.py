"""What a caller gets from a stream: its RequestOutput, its updates as they come, and the text
decoder the host uses."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flashlane.lanes.stops import read_text
from flashlane.lanes.stream import Stream
from flashlane.request import FinishReason, RequestOutput, RequestStats


@dataclass(frozen=True, slots=True)
class Update:
    """What a round produced for one request: its new tokens, and its end."""

    stream: Stream  # the stream itself, for outputs and stats (read it, don't change it)
    token_ids: list[int]  # reply tokens new since the last update
    text: str  # final text new since the last update ("" without a detokenize)
    finish: str | None  # "stop" | "length" | "abort" | "error"; None while running
    error: str | None


def news(s: Stream) -> Update | None:
    """The stream's tokens and final text since its last update, marked delivered (None: a
    stream that delivers nothing, num_delivered < 0)."""
    if s.num_delivered < 0:
        return None
    tokens = s.reply_ids[s.num_delivered :]
    read_text(s)
    text = s.detok.text[s.num_sent_chars : s.num_final_chars] if s.detok else ""
    s.num_delivered = len(s.reply_ids)
    s.num_sent_chars = max(s.num_sent_chars, s.num_final_chars)
    return Update(s, tokens, text, s.finish, s.error)


def output(s: Stream) -> RequestOutput:
    """The stream's reply so far as a RequestOutput (the whole reply once it has ended)."""
    now = s.ended_at or time.monotonic()
    first = s.first_token_at or now
    stats = RequestStats(
        rounds=s.num_rounds,
        drafted=s.num_drafted,
        accepted=s.num_accepted,
        cached_tokens=s.num_cached,
        moves=s.num_moves,
        pauses=s.num_pauses,
        preemptions=s.num_preempted,
        queue_seconds=max(0.0, s.admitted_at - s.submitted_at) if s.admitted_at else 0.0,
        prefill_seconds=max(0.0, first - s.admitted_at) if s.admitted_at else 0.0,
        decode_seconds=max(0.0, now - first) if s.first_token_at else 0.0,
    )
    return RequestOutput(
        request_id=s.request_id,
        prompt_token_ids=list(s.prompt_ids),
        token_ids=list(s.reply_ids),
        text=s.detok.text[: s.num_final_chars] if s.detok else "",
        finish_reason=FinishReason(s.finish) if s.finish else None,
        seed=s.seed,
        stats=stats,
        error=s.error,
        logprobs=list(s.logprobs) if s.logprobs is not None else None,
        stop_string=s.stop_string,
    )


class TextDecoder:
    """A `detokenize` callable seen as the tokenizer that IncrementalDetokenizer reads."""

    def __init__(self, detokenize: Callable[[list[int]], str]) -> None:
        self._detokenize = detokenize

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._detokenize(ids)
