"""Turns, window plans and acceptance: which streams run a round, with which rows, and what a
verdict makes of them.

A plan is the pending token, then forced tokens (a thinking close: certain), else the stream's
held drafts (a copy draft, else MTP drafts: each with a chance to land). `allocate` decides how
many of a plan's drafts go into the window; zero makes it a plain one-row window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from flashlane.lanes.records import CHUNK, Verdict, Window
from flashlane.lanes.stream import DraftKind, Stream


@dataclass(frozen=True, slots=True)
class Plan:
    stream: Stream
    forced: tuple[int, ...]  # forced tokens for rows 1.. (no drafts follow them)
    drafts: tuple[int, ...]  # drafts for the rows after the pending token, before allocation
    kind: DraftKind | None  # the drafts' kind, None without drafts
    # Chance each draft lands given every earlier one landed (its prior scaled by this stream's
    # acceptance at that depth); the product up to a depth is that row's landing probability.
    chances: tuple[float, ...]
    priors: tuple[float, ...]  # each draft's own prior, recorded into the acceptance stats

    @property
    def is_measured(self) -> bool:
        """Whether the stream's acceptance of this kind at depth 1 has been observed."""
        stats = self.stream.copy if self.kind == "copy" else self.stream.mtp
        return stats.is_measured(1)


def take_turns(live: Sequence[Stream], max_rows: int, max_streams: int) -> list[Stream]:
    """Decoding streams least recently served first (then oldest), one row each at least,
    within the row cap and the stream cap."""
    ready = [s for s in live if not s.is_filling and not s.is_finished]
    ready.sort(key=lambda s: (s.last_served, s.arrival))
    return ready[: max(0, min(max_rows, max_streams))]


def plan(stream: Stream) -> Plan:
    """The stream's next window before allocation: forced > copy draft > held MTP drafts."""
    room = stream.room - 1
    if stream.forced:
        return Plan(stream, tuple(stream.forced[:room]), (), None, (), ())
    held = stream.held
    if held is None or held.start != stream.start or room <= 0:
        return Plan(stream, (), (), None, (), ())
    stats = stream.copy if held.kind == "copy" else stream.mtp
    priors = held.priors[:room]
    chances = tuple(stats.chance(d, p) for d, p in enumerate(priors, 1))
    return Plan(stream, (), held.tokens[:room], held.kind, chances, priors)


def fit_forced(plans: Sequence[Plan], max_rows: int) -> list[Plan]:
    """Trim forced rows so every window fits the row cap (one row each at least); the forced
    tokens left out stand as later bonus tokens or windows."""
    spare = max_rows - len(plans)
    fitted = []
    for p in plans:
        n = max(0, min(len(p.forced), spare))
        spare -= n
        fitted.append(p if n == len(p.forced) else replace(p, forced=p.forced[:n]))
    return fitted


def decode_window(p: Plan, num_drafts: int) -> Window:
    s = p.stream
    tokens = (s.reply_ids[-1], *p.forced, *p.drafts[:num_drafts])
    return Window(s.stream_id, s.session_id, s.start, tokens, s.draws)


def prompt_piece(stream: Stream, max_rows: int) -> Window | None:
    """The stream's next prompt piece within `max_rows`: it ends on the CHUNK grid unless it
    ends the prompt, and at the stream's next mark at the latest; None when the budget does not
    reach the grid."""
    length = len(stream.prompt_ids)
    start = stream.filled
    end = length if length - start <= max_rows else (start + max_rows) // CHUNK * CHUNK
    # a piece never crosses a mark: fresh and resumed prompts cut at the same positions
    end = min([end, *(m for m in stream.marks if m > start)])
    if end <= start:
        return None
    tokens = tuple(stream.prompt_ids[start:end])
    last = end == length
    return Window(stream.stream_id, stream.session_id, start, tokens, stream.draws, "prompt", last)


def accept(p: Plan, window: Window, verdict: Verdict) -> tuple[list[int], int]:
    """The tokens a decode window yields and how many of its drafts landed.

    Forced rows always stand; drafts stand up to the first that differs from the target's own
    draw at the row before it; then the bonus: the draw after the last standing row, unless a
    forced token is due there, which replaces the draw.
    """
    tokens, sampled = window.tokens, verdict.sampled
    num_forced = len(p.forced)
    path: list[int] = []
    for r in range(1, len(tokens)):
        if r > num_forced and tokens[r] != sampled[r - 1]:
            break
        path.append(tokens[r])
    due = p.stream.forced[num_forced:]
    path.append(due[0] if due else sampled[len(path)])
    return path, len(path) - 1 - num_forced


def first_token(stream: Stream, verdict: Verdict) -> list[int]:
    """The prompt's draw, or the forced token that replaces it (a thinking budget of 0)."""
    return [stream.forced[0] if stream.forced else verdict.sampled[0]]
