"""The lane core: one round of shared verification over the Backend protocol (DESIGN.md 3).

Plain Python over integers. `LaneCore.step` takes the live streams and this round's prompt
pieces, runs ONE verify over all of them, concludes every window, keeps the accepted rows and
asks for the next drafts. An error that belongs to one stream ends that stream here; an error of
a whole backend call raises `RoundFailed` naming the streams in it, for the host's `fail_all`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from flashlane.lanes.allocate import allocate
from flashlane.lanes.depth import RoundPrices, best_depth, choose_depth, round_prices
from flashlane.lanes.protocol import Backend
from flashlane.lanes.records import CostTable, Verdict, Window
from flashlane.lanes.stops import StopRules, conclude
from flashlane.lanes.stream import DraftStats, Held, Stream
from flashlane.lanes.windows import (
    Plan,
    accept,
    decode_window,
    first_token,
    fit_forced,
    plan,
    take_turns,
)

# A copy draft's prior chance to land, before the stream's own copy acceptance is measured.
COPY_PRIOR = 0.5
COPY_DRAFTS = 8  # the longest copy draft the engine asks for


@dataclass(frozen=True, slots=True)
class LaneConfig:
    max_rows: int = 16  # decode rows per round: the verify batch (prompt rows are separate)
    max_streams: int = 16  # streams per round; the session count
    mtp_drafts: int = 3  # the deepest MTP chain; 0: no MTP drafts
    copy_drafts: int = COPY_DRAFTS  # the longest copy draft; 0: no copy drafts
    unpriced: bool = False  # draft rows by landing chance alone, up to max_rows

    @property
    def widest_window(self) -> int:
        """The most rows a stream's decode window can want: the pending token and the
        deepest draft (MTP's chain or a copy), before the round's cap."""
        return 1 + max(self.mtp_drafts, self.copy_drafts)


class RoundFailed(Exception):
    """A backend call failed as a whole; every stream in it ends with this error."""

    def __init__(self, stream_ids: list[int], error: str) -> None:
        super().__init__(error)
        self.stream_ids = stream_ids
        self.error = error


class LaneCore:
    def __init__(self, backend: Backend, config: LaneConfig, rules: StopRules) -> None:
        self.backend = backend
        self.config = config
        self.rules = rules
        self.costs: CostTable | None = None if config.unpriced else backend.costs()
        self.num_rounds = 0
        # How the MTP head's drafts have landed for every stream so far: the depth rule's odds
        # that a stream yet to catch up its head finds drafts worth the catch-up.
        self.mtp_pool = DraftStats()

    def step(
        self,
        live: Sequence[Stream],
        pieces: Sequence[Window],
        undrafted: Callable[[Stream], bool] | None = None,
    ) -> None:
        """One round of the live streams' decode windows and these prompt pieces. Streams
        for which `undrafted` says so get no next drafts (the host's lone driver takes
        them next: shared-round drafts would be work for nothing)."""
        cfg = self.config
        streams = take_turns(live, cfg.max_rows, cfg.max_streams)
        plans = fit_forced([plan(s) for s in streams], cfg.max_rows)
        num_prompt_rows = sum(w.num_rows for w in pieces)
        counts = allocate(plans, self.costs, cfg.max_rows, num_prompt_rows)
        windows = [decode_window(p, n) for p, n in zip(plans, counts)]
        if not windows and not pieces:
            return
        by_id = {s.stream_id: s for s in live}
        in_round = [w.stream_id for w in (*windows, *pieces)]
        verdicts = _call(in_round, self.backend.verify, [*windows, *pieces])
        if len(verdicts) != len(in_round):
            raise RoundFailed(in_round, f"verify returned {len(verdicts)} verdicts")
        kept: dict[int, int] = {}
        for p, n, w, v in zip(plans, counts, windows, verdicts):
            _put(kept, w, self._conclude_window(p, n, w, v))
        for w, v in zip(pieces, verdicts[len(windows) :]):
            _put(kept, w, self._conclude_piece(by_id[w.stream_id], w, v))
        _call(list(kept), self.backend.keep, kept)
        ready = [
            by_id[i]
            for i in kept
            if by_id[i].start >= len(by_id[i].prompt_ids)
            and not (undrafted and undrafted(by_id[i]))
        ]
        decoding = sum(1 for s in live if not s.is_finished and s.start >= len(s.prompt_ids))
        # With a row per decoding stream the cap leaves no draft rows: drafts would be wasted.
        if decoding < cfg.max_rows:
            self._draft(ready, decoding)
        self.num_rounds += 1

    def _conclude_window(self, p: Plan, num_drafts: int, w: Window, v: Verdict) -> int | None:
        """Rows kept: one per token the reply took (row 0 included); None on the stream's error."""
        s = p.stream
        s.last_served = self.num_rounds
        s.num_rounds += 1
        s.held = None
        if p.kind == "mtp":
            s.is_refused = not num_drafts
        if not _is_sound(s, w, v):
            return None
        path, landed = accept(p, w, v)
        if num_drafts:
            stats = s.copy if p.kind == "copy" else s.mtp
            priors = list(p.priors[:num_drafts])
            stats.record(priors, landed)
            if p.kind == "mtp":
                self.mtp_pool.record(priors, landed)
            s.num_drafted += num_drafts
            s.num_accepted += landed
        return conclude(s, path, self.rules, v.logprobs)

    def _conclude_piece(self, s: Stream, w: Window, v: Verdict) -> int | None:
        """A prompt piece keeps all its rows; the last one's draw starts the reply."""
        if not _is_sound(s, w, v):
            return None
        s.filled = w.start + w.num_rows
        if not w.last_piece:  # the backend's head absorbs a piece's cells as it is kept, all
            s.absorbed = s.filled - 1  # but the last row's (its next token is the next piece's)
        if w.last_piece:
            s.last_served = self.num_rounds
            conclude(s, first_token(s, v), self.rules, v.logprobs)
        return w.num_rows

    def _mtp_depth(self, s: Stream, prices: RoundPrices, room: int) -> int:
        """The depth rule for the stream's next MTP chain (flashlane.lanes.depth)."""
        # cells past the one or two a stream that drafted last round has its head absorb
        catch_up = max(0, s.start - s.absorbed - 2)
        return choose_depth(
            s.mtp,
            prices,
            s.num_rounds,
            catch_up,
            rounds_left=room,
            is_refused=s.is_refused,
            odds=self.mtp_pool.typical(1),
        )

    def _draft(self, streams: Sequence[Stream], round_rows: int = 1) -> None:
        """Next drafts for the streams just served: a copy draft where the context repeats,
        else an MTP chain as deep as the depth rule says."""
        cfg = self.config
        depths: dict[int, int] = {}
        by_id = {s.stream_id: s for s in streams}
        # the depth rule's prices are the round's, not a stream's: made once, when first needed
        mtp_prices = copy_prices = None
        for s in streams:
            # drafts past the reply's last token would verify for nothing
            room = min(s.room, s.params.max_tokens - len(s.reply_ids)) - 1
            if s.is_finished or s.forced or not s.params.draft or room <= 0:
                continue
            copied = s.copy_index.propose(min(cfg.copy_drafts, room)) if s.copy_index else []
            if copied and self.costs is not None and s.copy.is_measured(1):
                # as deep as this stream's measured copy acceptance pays; none: an MTP chain
                if copy_prices is None:
                    copy_prices = round_prices(
                        self.costs, cfg.copy_drafts, round_rows, cfg.max_rows, chained=False
                    )
                copied = copied[: best_depth(s.copy, copy_prices, len(copied))]
            if copied:
                s.held = Held("copy", s.start, tuple(copied), (COPY_PRIOR,) * len(copied))
                continue
            if self.costs is None:
                depth = cfg.mtp_drafts
            else:
                if mtp_prices is None:
                    mtp_prices = round_prices(self.costs, cfg.mtp_drafts, round_rows, cfg.max_rows)
                depth = self._mtp_depth(s, mtp_prices, room)
            depth = min(room, depth)
            if depth > 0:
                depths[s.stream_id] = depth
        if not depths:
            return
        for sid in depths:
            by_id[sid].absorbed = by_id[sid].start
        for d in _call(list(depths), self.backend.draft, depths):
            s = by_id.get(d.stream_id)
            if s is None or d.stream_id not in depths:
                continue
            if d.error is not None:
                s.end("error", d.error)
            elif d.tokens:
                n = min(len(d.tokens), len(d.probs), depths[d.stream_id])
                s.held = Held("mtp", s.start, tuple(d.tokens[:n]), tuple(d.probs[:n]))


def _is_sound(s: Stream, w: Window, v: Verdict) -> bool:
    """Ends the stream on its own error, or on a verdict that does not fit its window."""
    if v.error is not None:
        s.end("error", v.error)
    elif v.stream_id != w.stream_id or len(v.sampled) != w.num_draws:
        s.end("error", f"backend returned {len(v.sampled)} draws for {w.num_draws}")
    return not s.is_finished


def _put(kept: dict[int, int], w: Window, rows: int | None) -> None:
    if rows is not None:
        kept[w.stream_id] = rows


def _call(stream_ids: list[int], fn: Callable[[Any], Any], arg: Any) -> Any:
    try:
        return fn(arg)
    except Exception as exc:  # a whole-call failure ends the streams in it, not the engine
        raise RoundFailed(stream_ids, f"{type(exc).__name__}: {exc}") from exc
