"""The lane host: requests in, rounds run, tokens out (DESIGN.md section 3, `host.run_once`).

A caller (LLM, the engine thread) drives it: `submit` requests, then `run_once` per round while
`has_work`; each round returns the Updates to hand to the callers. `cancel` and `drop` take
effect at the start of the next round. Every stream ends with its session released; an error
that belongs to one stream ends only it, an error of a whole backend call ends the streams in
it (`fail_all`), and the host goes on serving.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flashlane.detok import IncrementalDetokenizer, StopMatcher
from flashlane.lanes.cached_prompts import keep_marks, resume
from flashlane.lanes.copy_drafts import CopyIndex
from flashlane.lanes.core import LaneConfig, LaneCore, RoundFailed
from flashlane.lanes.lone_turn import beside_budget, lag_heads, lone_drawn, lone_streams, run_lone
from flashlane.lanes.outputs import TextDecoder, Update, news
from flashlane.lanes.piece_clock import STALL, PieceClock
from flashlane.lanes.protocol import Backend, LoneDriving
from flashlane.lanes.records import CHUNK, Window
from flashlane.lanes.session_pool import SessionPool
from flashlane.lanes.stops import StopRules, begin, conclude, finish_text, read_text
from flashlane.lanes.stream import Stream
from flashlane.lanes.windows import prompt_piece
from flashlane.request import SamplingParams, effective_seed
from flashlane.sessions.prompt_cache import DEFAULT_EVERY, PromptCache, prompt_marks


class QueueFull(RuntimeError):
    """More requests waiting than `max_queue`; nothing was queued."""


@dataclass(frozen=True, slots=True)
class HostConfig:
    lanes: LaneConfig = field(default_factory=LaneConfig)
    max_queue: int = 256  # requests waiting for a session
    prefill_rows: int = 1024  # prompt rows per round, all filling streams together
    # While replies decode, prompt rows per round are capped at (1 - decode_share) of
    # prefill_rows (at least one chunk), and decoders on the lone driver get decode_share of
    # the time beside a round's pieces (lone_turn.beside_budget): a long prompt neither
    # starves live replies nor waits on them (a quarter: its TTFT about 1.33x alone from
    # their share, under issue 29's 1.5x; a half made it 2x)
    decode_share: float = 0.25
    # ... and sized by the piece clock: a round with pieces takes at most `stall` rounds
    # without them (lanes/piece_clock.py)
    stall: float = STALL
    prompt_cache_bytes: int = 0  # the prompt cache's budget; 0 disables it
    mark_every: int = DEFAULT_EVERY  # a long prompt keeps a state every this many tokens
    lone_steps: int = 32  # steps of one lone-driver call before the host looks for new work
    lone_streams: int = 1  # decoding streams the lone driver may take together


class LaneHost:
    def __init__(
        self,
        backend: Backend,
        config: HostConfig,
        rules: StopRules,
        capacities: Sequence[int],
        grow: int | None = None,
        lone: LoneDriving | None = None,
    ) -> None:
        """`lone`: the lone driver (runner.lone.LoneDriver), to which the decoding streams'
        rounds go (lanes/lone_turn.py says which; None: every round is a shared one)."""
        self.backend = backend
        self.lone = lone
        # Set by a caller that takes requests while the host runs (the engine thread): True
        # when work waits, so a lone call ends after its next step and the next round admits
        # the work (its prompt pieces then run beside the lone steps).
        self.interrupted: Callable[[], bool] = lambda: False
        # a streaming caller's sink: a lone call hands it updates every STREAM_EVERY
        self.on_updates: Callable[[list[Update]], None] | None = None
        self.config = config
        self.rules = rules
        self.core = LaneCore(backend, config.lanes, rules)
        self.sessions = SessionPool(capacities, grow, _window_rows(config.lanes))
        self.cache = PromptCache(config.prompt_cache_bytes)
        self.clock = PieceClock(config.stall)
        self.waiting: deque[Stream] = deque()
        self.live: list[Stream] = []
        self._cancels: dict[str, bool] = {}  # request_id -> deliver an "abort" update
        self._next_id = 0
        self._updates: list[Update] = []
        # cumulative, for the stats line (server/stats_log.py): rounds, prompt rows fed,
        # seconds in shared rounds and on the lone driver
        self.counts = {"rounds": 0, "piece_rows": 0, "shared_s": 0.0, "lone_s": 0.0}

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.live or self._cancels)

    def submit(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int | None = None,
        boundaries: Sequence[int] = (),
    ) -> int:
        """Queue a request; returns the seed it runs with. Raises (queueing nothing) on bad
        input, a prompt no session holds (NoSessionFits) or a full queue (QueueFull).
        `boundaries`: token offsets where chat messages end (prompt-cache marks)."""
        prompt = [int(t) for t in prompt_ids]
        if not prompt or min(prompt) < 0:
            raise ValueError("the prompt must hold at least one token id, none negative")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {params.max_tokens}")
        if any(s.request_id == request_id for s in (*self.waiting, *self.live)):
            raise ValueError(f"request {request_id!r} is already running")
        self.sessions.check(len(prompt), params.max_tokens)
        if len(self.waiting) >= self.config.max_queue:
            raise QueueFull(f"{len(self.waiting)} requests are waiting (--max-queue)")
        chosen = effective_seed(params.seed if seed is None else seed)
        stream = Stream(self._next_id, request_id, prompt, params, chosen, -1, 0, 0)
        stream.submitted_at = time.monotonic()
        if self.cache.is_enabled:
            stream.marks = prompt_marks(len(prompt), boundaries, self.config.mark_every)
        self._next_id += 1
        self.waiting.append(stream)
        return stream.seed

    def hand_off(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        seed: int,
        session_id: int,
        reply_ids: Sequence[int],
    ) -> Stream:
        """Adopt a reply decoded elsewhere (the lone driver) whose state is already in the free
        session `session_id`: the session holds the prompt and every reply token but the last,
        which is pending. The reply is replayed through the stop rules, so thinking count, loop
        guard and text stand as if the lanes had made it; nothing is held, so the next window
        starts at the cache's end. Its tokens count as delivered; bind it in the backend under
        the returned stream's id."""
        if not reply_ids:
            raise ValueError("a handed-off reply holds at least its pending token")
        self.sessions.claim(session_id)
        s = Stream(self._next_id, request_id, list(prompt_ids), params, seed, session_id, 0, 0)
        self._next_id += 1
        s.capacity = self.sessions.capacities[session_id]
        s.max_capacity = max(self.sessions.capacities)
        s.arrival, s.admitted_at = s.stream_id, time.monotonic()
        s.filled = len(s.prompt_ids)
        self._dress(s)
        conclude(s, list(reply_ids), self.rules)
        read_text(s)
        s.num_delivered = len(s.reply_ids)
        s.num_sent_chars = s.num_final_chars
        s.first_token_at = s.admitted_at
        self.live.append(s)
        return s

    def cancel(self, request_id: str) -> None:
        """End the request at the next round with finish "abort" (its tokens so far kept)."""
        self._cancels[request_id] = True

    def drop(self, request_id: str) -> None:
        """End the request at the next round and deliver nothing more (its caller is gone)."""
        self._cancels.setdefault(request_id, False)

    def run_once(self) -> list[Update]:
        """One round: cancels, admission, room, prompt pieces, the lane core's step, delivery."""
        self._take_cancels()
        self._release_finished()
        self._admit()
        for stream, reason in self.sessions.make_room(self.backend, self.live):
            self._end(stream, reason)
        running = [s for s in self.live if not s.is_paused]
        alone = lone_streams(self, running)
        taken = {id(s) for s in alone}
        rest = [s for s in running if id(s) not in taken]
        decoding = any(not s.is_filling for s in running)
        lone_call = self._lone_call(alone)
        started, pieces = time.perf_counter(), self._pieces(rest, decoding, lone_call)
        shared = started
        try:
            if rest:  # prompt pieces, and streams the lone driver does not take
                lag_heads(self, alone, rest, pieces)
                room = self.lone is not None and len(alone) < self.config.lone_streams
                self.core.step(rest, pieces, self._goes_lone if room else None)
                shared = time.perf_counter()
                alone = [s for s in alone if not s.is_finished]
                if alone:  # then the decoders' share of the time, on the lone driver
                    run_lone(self, alone, beside_budget(self, alone, shared - started))
            elif alone:
                run_lone(self, alone)
        except RoundFailed as failed:
            self.fail_all(failed.stream_ids, failed.error)
        ended, rows = time.perf_counter(), sum(p.num_rows for p in pieces)
        if decoding:  # the decoders waited this long for their next tokens
            self.clock.record(ended - started, rows, lone_call)
        c = self.counts
        c["rounds"], c["piece_rows"] = c["rounds"] + 1, c["piece_rows"] + rows
        c["shared_s"] += shared - started
        c["lone_s"] += ended - shared
        keep_marks(self.cache, self.backend, running)
        self._deliver()
        updates, self._updates = self._updates, []
        return updates

    def _goes_lone(self, s: Stream) -> bool:
        """Whether the lone driver takes this stream next round, where it has room for more
        (then no shared drafts for it)."""
        return lone_drawn(self, s)

    def fail_all(self, stream_ids: Sequence[int], error: str) -> None:
        """End these streams with `error` and release their sessions; the host goes on. Their
        updates come with the next `run_once`."""
        ids = set(stream_ids)
        for s in [s for s in self.live if s.stream_id in ids]:
            self._end(s, "error", error)

    def _take_cancels(self) -> None:
        for request_id, deliver in self._cancels.items():
            for s in (*self.waiting, *self.live):
                if s.request_id == request_id and not s.is_finished:
                    s.end("abort")
                    if not deliver:
                        s.num_delivered = -1
        self._cancels.clear()
        for s in [s for s in self.waiting if s.is_finished]:
            self.waiting.remove(s)
            self._report(s)

    def _admit(self) -> None:
        while self.waiting:
            s = self.waiting[0]
            if self._twin_filling(s):
                return
            session_id = self.sessions.allocate(len(s.prompt_ids), s.params.max_tokens)
            if session_id is None:
                return
            self.waiting.popleft()
            s.session_id, s.capacity = session_id, self.sessions.capacities[session_id]
            s.max_capacity = max(self.sessions.capacities)
            s.arrival, s.admitted_at = s.stream_id, time.monotonic()
            self._dress(s)
            need_drafts = s.params.draft and self.config.lanes.mtp_drafts > 0
            resume(self.cache, self.backend, s, need_drafts)
            self.live.append(s)

    def _twin_filling(self, s: Stream) -> bool:
        """Whether a live stream with the same prompt (a choice of the same n > 1 request, or
        a resent prompt) is still filling up to the prompt's last mark: `s` then waits for the
        prompt cache to keep that state and resumes from it, instead of filling it again. The
        twin passes the mark within its prefill, so the wait is bounded; a keep that fails
        only means `s` fills from zero."""
        if not self.cache.is_enabled or not s.marks:
            return False
        n, last = len(s.prompt_ids), s.marks[-1]
        return any(
            t.is_filling and t.filled < last and len(t.prompt_ids) == n
            and t.prompt_ids == s.prompt_ids and not t.is_finished
            for t in self.live
        )  # fmt: skip

    def _dress(self, s: Stream) -> None:
        """The per-stream helpers its params ask for: copy index, text, stop strings."""
        lanes = self.config.lanes
        if s.params.draft and lanes.copy_drafts > 0:
            s.copy_index = CopyIndex(s.prompt_ids, s.reply_ids)
        if s.params.logprobs is not None:
            s.logprobs = []
        if self.rules.detokenize is not None:
            s.detok = IncrementalDetokenizer(TextDecoder(self.rules.detokenize))
            if s.params.stop:
                s.matcher = StopMatcher(s.params.stop)
        begin(s, self.rules)

    def _lone_call(self, alone: Sequence[Stream]) -> float | None:
        """Seconds of a whole lone call for these decoders (the piece clock's round without
        pieces for them), None before their steps are measured."""
        step = self.lone.step_seconds(len(alone)) if alone and self.lone is not None else None
        return None if step is None else step * self.config.lone_steps

    def _pieces(
        self, running: Sequence[Stream], decoding: bool, lone_call: float | None = None
    ) -> list[Window]:
        """One prompt piece per filling stream, oldest first, within the round's prompt rows:
        while replies decode, as many as the piece clock finds keep their gaps short."""
        cfg = self.config
        budget = cfg.prefill_rows
        if decoding:
            most = max(CHUNK, int(budget * (1.0 - cfg.decode_share)) // CHUNK * CHUNK)
            budget = self.clock.rows(most, lone_call)
        pieces = []
        for s in sorted((s for s in running if s.is_filling), key=lambda s: s.arrival):
            piece = prompt_piece(s, budget)
            if piece is not None:
                pieces.append(piece)
                budget -= piece.num_rows
        return pieces

    def _deliver(self) -> None:
        now = time.monotonic()
        for s in self.live:
            if s.reply_ids and not s.first_token_at:
                s.first_token_at = now
        self._release_finished()
        for s in self.live:
            if len(s.reply_ids) > s.num_delivered:
                self._report(s)

    def _release_finished(self) -> None:
        for s in [s for s in self.live if s.is_finished]:
            self._end(s, s.finish or "error")

    def _end(self, s: Stream, reason: str, error: str | None = None) -> None:
        """Finish the stream (if not yet), release its session, report its last update."""
        s.end(reason, error)
        s.ended_at = time.monotonic()
        if s in self.live:
            self.live.remove(s)
            self.sessions.release(self.backend, s)
        finish_text(s)
        self._report(s)

    def _report(self, s: Stream) -> None:
        if (update := news(s)) is not None:
            self._updates.append(update)


def _window_rows(lanes: LaneConfig) -> int:
    """The most rows a decode window takes: the pending token and the deepest draft."""
    return min(lanes.max_rows, lanes.widest_window)
