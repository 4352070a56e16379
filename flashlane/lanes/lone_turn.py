"""A host round given to the lone driver (runner/lone.py) instead of the lane core.

When one stream is live (or up to `lone_streams`), nothing waits, and each is greedy or sampled
(any parameters), without a thinking budget, the host lets the lone driver run the next steps
on the device. A row the device's keyed draw cannot always settle (a top_p cut; logit_bias or a
penalty with top_p: sampling/lone_draw.py) is drawn on the host between steps, with one step in
flight (sampling/lone_draw.KeyedDraw.settle); a row that asks for logprobs gets them from the
step (sampling/logprobs.StepLogprobs). A sampled step keys its draw by the stream's seed and
the position drawn, as a shared round's decode window does (runner/backend._spec), so the
tokens are the shared rounds'. Each landed token goes through the same stop rules as a shared
round's; a row without a token ends the stream with the error a shared round gives
(sampling/spec.failure). The driver stops after a landed step when the last of its replies ends
(or one ends while requests wait for a session), its budget or room is spent, or the host is
interrupted (work arrived), and the streams are then exactly where shared rounds would have
left them. Where the host has a streaming caller (`LaneHost.on_updates`), a call hands it the
replies' new tokens every STREAM_EVERY seconds as it lands them, not only once it ends (a
32-step call of 6 ms steps held a stream's tokens for 190 ms: bench_serve_cuda_h100_66fe4d1_*).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from flashlane.lanes.core import RoundFailed
from flashlane.lanes.outputs import news
from flashlane.lanes.records import Window
from flashlane.lanes.stops import conclude
from flashlane.lanes.stream import Stream
from flashlane.sampling.spec import DrawSpec, failure, is_plain_greedy

if TYPE_CHECKING:
    from flashlane.lanes.host import LaneHost

MAX_HINT = 4  # copy drafts a drafted call's first step may take (it takes up to its depth)
STREAM_EVERY = 0.02  # seconds between a lone call's deliveries to a streaming caller


def lone_streams(host: LaneHost, running: Sequence[Stream]) -> list[Stream]:
    """The streams the lone driver may take this round: the decoding ones, greedy or sampled
    (any parameters, greedy and sampled together too; no thinking budget, forced tokens or
    grammar; room for a step), oldest first, at most `lone_streams` of them. The rest (prompt
    pieces, other streams) go to a shared round beside them (LaneHost.run_once). Sampled
    streams (and greedy ones with logit_bias, a penalty or logprobs) only where the driver
    takes them (`LoneDriver.sampled`; EngineConfig.lone_sampled)."""
    if host.lone is None or not running:
        return []
    # A drafting stream too: a lone step costs less than a drafted shared round gains (tiny
    # model on the H200: 6.3x one stream's shared rounds), and drafts change no token. Its
    # steps' cells are queued for its MTP head, so drafting resumes in shared rounds (the
    # driver drafts a few greedy streams itself: runner/lone_draft.py).
    return [s for s in running if lone_drawn(host, s)][: host.config.lone_streams]


def lone_drawn(host: LaneHost, s: Stream, prompt_ends: bool = False) -> bool:
    """Whether the lone driver can decode this stream (lone_streams' rule for one stream);
    `prompt_ends`: once the prompt piece it runs now, its last, is kept."""
    if (
        host.lone is None
        or (s.is_filling and not prompt_ends)
        or s.is_finished
        or s.forced
        or s.is_thinking
        or (s.logprobs is not None and not host.lone.sampled)
        or s.room < 1
        or s.params.structured is not None
    ):
        return False
    return host.lone.sampled or is_plain_greedy(DrawSpec(s.params, s.seed, s.start))


def lag_heads(host: LaneHost, alone, rest: Sequence[Stream], pieces: Sequence[Window]) -> None:
    """Drafting streams whose prompts end this round into a lone call wider than a drafted
    one (LoneDriving.most_drafted) would lag in that call (runner/lone.py): they lag now,
    so the round queues none of their cells (64 prompts of 128 tokens: ~0.1 ms a round)."""
    lone, ending = host.lone, {w.stream_id for w in pieces if w.last_piece}
    if lone is None or not lone.most_drafted or not ending:
        return
    # those past the call's room (`lone_streams`) decode in shared rounds, drafting there
    joining = [
        s.stream_id
        for s in rest
        if s.stream_id in ending and s.params.draft and lone_drawn(host, s, prompt_ends=True)
    ][: max(0, host.config.lone_streams - len(alone))]
    if joining and len(alone) + len(joining) > lone.most_drafted:
        lone.lag(joining)


def beside_budget(host: LaneHost, streams: list[Stream], shared_seconds: float) -> int:
    """Lone steps for `streams` after a shared round of the others took `shared_seconds`:
    the decoders get decode_share of the time (a quarter by default), at least one step, so
    a long prompt's pieces neither stall them nor wait long for them."""
    share = host.config.decode_share
    step = host.lone.step_seconds(len(streams))
    if step is None:  # not measured yet: a few steps
        return 4
    want = shared_seconds * share / max(1e-6, 1.0 - share)
    return max(1, min(host.config.lone_steps, int(want / step)))


def run_lone(host: LaneHost, streams: list[Stream], steps: int | None = None) -> None:
    """Decode `streams` together on the lone driver for up to `steps` (default `lone_steps`)
    steps, as many as the reply that wants the most tokens takes. A stream whose reply ends
    rides along (its rows are no reply's) while the others go on: the call ends after the
    landed step in which the last of them ends, or in which one ends while requests wait for
    a session (its release admits them), or once the host has new work. (Streams that drafted
    ended a step or more apart, and each end cut the call short: 16 greedy streams of 64
    tokens on the H100 ran 13 calls, the last twelve of one to four steps, ccd8297.)"""

    def take_for(s: Stream) -> Callable[[int, bool], bool]:
        def take(token: int, finite: bool, logprobs: dict | None = None) -> bool:
            if s.is_finished:
                return False  # a step launched before the end was read: not the reply's
            if not finite:  # the token's place holds why (greedy steps: a generic reason)
                s.end("error", f"sampling failed: {failure(token)}")
                return False
            conclude(s, [token], host.rules, [logprobs] if logprobs is not None else None)
            s.num_rounds += 1
            return not s.is_finished

        return take

    delivered = [time.perf_counter()]

    def ends(done: list[bool]) -> bool:  # after each landed step
        if host.on_updates is not None and time.perf_counter() - delivered[0] >= STREAM_EVERY:
            _deliver(host, streams)
            delivered[0] = time.perf_counter()
        return all(done) or host.interrupted() or (any(done) and bool(host.waiting))

    # every session holds every step launched: no more than the least room
    budget = min(
        [steps or host.config.lone_steps, max(_left(s) for s in streams)]
        + [s.room for s in streams]
    )
    # drafts held for a shared window: a drafted call's first guesses (_hint)
    held = [s.held for s in streams]
    for s in streams:
        s.held = None  # the lone steps make them stale
    try:
        if _drafted(host, streams, take_for, held, budget, ends):
            return
        host.lone.decode_many(
            [s.session_id for s in streams], [s.reply_ids[-1] for s in streams],
            [s.start for s in streams], budget, [take_for(s) for s in streams],
            [s.stream_id for s in streams], [s.draws for s in streams], ends,
        )  # fmt: skip
    except Exception as exc:  # a failed step ends these streams, not the host
        raise RoundFailed([s.stream_id for s in streams], f"{type(exc).__name__}: {exc}") from exc


def _deliver(host: LaneHost, streams: list[Stream]) -> None:
    """The new tokens of the call's replies still going, to the streaming caller now (an
    ended reply's last update waits for the host's round end, which releases its session)."""
    going = [s for s in streams if not s.is_finished and len(s.reply_ids) > s.num_delivered]
    updates = [u for u in map(news, going) if u is not None]
    if updates:
        host.on_updates(updates)


def _hint(s: Stream, held) -> list[int]:
    """The stream's guesses at its next tokens: drafts it held for its pending token, else
    its copy drafts (free on the host), else none."""
    if held is not None and held.start == s.start:
        return list(held.tokens)
    return s.copy_index.propose(MAX_HINT) if s.copy_index is not None else []


def _left(s: Stream) -> int:
    """The tokens the stream's reply may still take."""
    return s.params.max_tokens - len(s.reply_ids)


def _drafted(host: LaneHost, streams, take_for, held: list, budget: int, ends) -> bool:
    """Up to `budget` drafted lone steps (runner/lone_draft.py) for streams that all draft
    greedily, when the driver has them and finds they pay; False where plain steps should
    run instead (sampled streams: drafted steps draw greedily). `budget`: run_lone's, so
    that decoders beside a round's prompt pieces keep to their share of the time drafted
    too (beside_budget; at 63de559 a drafted call ran lone_steps whatever its share)."""
    if len(streams) > host.lone.most_drafted or not all(
        s.params.draft
        and s.draws is not None
        and s.params.logprobs is None
        and is_plain_greedy(DrawSpec(s.params, s.seed, s.start))
        for s in streams
    ):
        return False
    hints = [_hint(s, h) for s, h in zip(streams, held)]
    ran = host.lone.decode_drafted(
        [s.session_id for s in streams], [s.reply_ids[-1] for s in streams],
        [s.start for s in streams], budget,
        min(s.room for s in streams), [take_for(s) for s in streams],
        [s.stream_id for s in streams], [s.draws for s in streams], hints=hints,
        left=[_left(s) for s in streams], ends=ends,
    )  # fmt: skip
    if ran is None:
        return False
    for s, made, landed in zip(streams, *ran):
        s.num_drafted += made
        s.num_accepted += landed
    return True
