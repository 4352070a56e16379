"""What a caller gets from a stream: its RequestOutput, and the text decoder the host uses."""

from __future__ import annotations

import time
from collections.abc import Callable

from flashlane.lanes.stream import Stream
from flashlane.request import FinishReason, RequestOutput, RequestStats


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
