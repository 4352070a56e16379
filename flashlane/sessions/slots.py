"""Sized sessions: parse `--slot-contexts` and `--slot-grow`, choose a session, decide room.

Plain integer bookkeeping, no torch. A session is identified by its index in the capacity list
(tokens of context it holds). The lane core asks:
  - at admission, `choose_session`: the smallest free session that holds the prompt plus the
    next grow margin (None: wait for one to free); a request no session could ever hold raises
    `NoSessionFits` at once;
  - before each round, `room` (or `rooms` for all streams at once): fits, run, move, pause or end.

Positions: a stream whose session holds `committed` positions may run a window of `rows` rows
when committed + rows <= capacity. The reply's end is prompt + max_tokens + one window: a
session that holds it holds every round of the reply, however many drafts are rejected.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Literal

SLOT_CONTEXTS_ENV = "FLASHNEXT_SLOT_CONTEXTS"
SLOT_GROW_ENV = "FLASHNEXT_SLOT_GROW"
DEFAULT_GROW = 8192
DEFAULT_MAX_SESSIONS = 64
# Positions are int32 on the device; every count and sum stays below this.
MAX_TOKENS = 2**31 - 1

_ITEM = re.compile(r"\s*([0-9]+)\s*(?:[xX]\s*([0-9]+)\s*)?")

Action = Literal["fits", "run", "move", "pause", "end"]


class NoSessionFits(ValueError):
    """A request that no session could ever hold (too long a prompt for the largest session)."""


@dataclass(frozen=True, slots=True)
class Demand:
    """What one stream needs from its session, in positions."""

    session_id: int  # the session it holds now
    committed: int  # positions whose state the session holds (the next window's start)
    prompt_len: int
    max_tokens: int
    # The most rows its decode window may take (1 + drafts); pass the same while the prompt
    # fills: admission held the whole prompt, so every prompt piece fits.
    window_rows: int


@dataclass(frozen=True, slots=True)
class Room:
    """The verdict for one stream before a round."""

    # fits: its session holds the whole reply (never moved or paused); run: short of the
    # reply's end but room for this round; move: to session_id first; pause: skip this round,
    # state kept, until a larger session frees; end: the largest session is full.
    action: Action
    session_id: int  # where it runs this round: the move's target, else its own session
    rows: int  # the most window rows that fit this round there (0 for pause and end)


def parse_slot_contexts(text: str, max_sessions: int = DEFAULT_MAX_SESSIONS) -> tuple[int, ...]:
    """Parse "65536,32768x3,16384x11": one capacity per session, in the order given.

    Spaces are tolerated; `CONTEXTxN` stands for N sessions alike. Each repeat count is checked
    against the sessions still allowed before anything is added, so a refused list builds nothing.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("--slot-contexts is empty; give token counts such as '65536,32768x3'")
    out: list[int] = []
    for raw in text.split(","):
        item = raw.strip()
        match = _ITEM.fullmatch(raw)
        if match is None:
            raise ValueError(
                f"--slot-contexts {text!r}: {raw.strip()!r} is not a token count or CONTEXTxN"
            )
        label = f"--slot-contexts {text!r}:"
        context = _count(match.group(1), f"{label} context")
        repeat = 1 if match.group(2) is None else _count(match.group(2), f"{label} repeat count")
        if context == 0:
            raise ValueError(f"--slot-contexts {text!r}: a session of 0 tokens holds nothing")
        if repeat == 0:
            raise ValueError(f"--slot-contexts {text!r}: {item!r} repeats a session 0 times")
        allowed = max_sessions - len(out)
        if repeat > allowed:
            raise ValueError(
                f"--slot-contexts {text!r}: more than {max_sessions} sessions "
                f"({item!r} asks for {repeat} with {allowed} left)"
            )
        out.extend([context] * repeat)
    return tuple(out)


def format_slot_contexts(capacities: Sequence[int]) -> str:
    """The inverse of parse_slot_contexts: (65536, 32768, 32768) -> "65536,32768x2"."""
    runs = [(c, len(list(group))) for c, group in groupby(capacities)]
    return ",".join(f"{c}x{n}" if n > 1 else str(c) for c, n in runs)


def parse_slot_grow(text: str | int | None) -> int:
    """`--slot-grow` / FLASHNEXT_SLOT_GROW: the margin in tokens; None gives the default."""
    if text is None:
        return DEFAULT_GROW
    if isinstance(text, bool):
        raise ValueError(f"--slot-grow must be a token count, got {text!r}")
    value = text if isinstance(text, int) else _count(text.strip(), "--slot-grow")
    if not 1 <= value <= MAX_TOKENS:
        raise ValueError(f"--slot-grow must be between 1 and {MAX_TOKENS} tokens, got {value}")
    return value


def reply_end(prompt_len: int, max_tokens: int, window_rows: int) -> int:
    """Positions that hold a whole reply: prompt, every reply token and one window."""
    return _checked_sum(prompt_len, max_tokens, window_rows)


def max_model_len(capacities: Sequence[int], window_rows: int) -> int:
    """The most prompt + reply tokens one request may ask for: the largest session less one
    decode window, whose rows past the reply's last token must fit too (`reply_end`). A request
    within it is admissible whatever the grow margin, so the HTTP layer advertises this."""
    return max(capacities) - window_rows


def check_admissible(
    capacities: Sequence[int], prompt_len: int, max_tokens: int, window_rows: int, grow: int
) -> None:
    """Raise NoSessionFits when even the largest session cannot hold the prompt plus its
    next margin (or the whole reply, when that is shorter)."""
    need = _ahead(prompt_len, prompt_len, max_tokens, window_rows, grow)
    largest = max(capacities, default=0)
    if need > largest:
        raise NoSessionFits(
            f"the prompt of {prompt_len} tokens needs a session of {need} tokens (prompt + "
            f"min(max_tokens + a window, the --slot-grow margin of {grow})); the largest "
            f"session holds {largest}, so at most {largest - window_rows} tokens of prompt and "
            "reply together"
        )


def choose_session(
    capacities: Sequence[int],
    free_ids: Collection[int],
    prompt_len: int,
    max_tokens: int,
    window_rows: int,
    grow: int,
) -> int | None:
    """Admission: the smallest free session that holds the prompt plus its next margin (lower
    id on ties), or None to wait; raises NoSessionFits for a request no session could hold."""
    check_admissible(capacities, prompt_len, max_tokens, window_rows, grow)
    need = _ahead(prompt_len, prompt_len, max_tokens, window_rows, grow)
    return _smallest(capacities, free_ids, need, above=-1)


def room(demand: Demand, capacities: Sequence[int], free_ids: Collection[int], grow: int) -> Room:
    """Before a round: fits, run, move, pause or end (see Room)."""
    d = demand
    if not 0 <= d.session_id < len(capacities):
        raise ValueError(f"session {d.session_id} is not one of the {len(capacities)} sessions")
    cap = capacities[d.session_id]
    if d.window_rows < 1 or not 0 <= d.committed <= cap:
        raise ValueError(f"stream in session {d.session_id} ({cap} tokens): bad demand {d}")
    if reply_end(d.prompt_len, d.max_tokens, d.window_rows) <= cap:
        return Room("fits", d.session_id, d.window_rows)
    ahead = _ahead(d.committed, d.prompt_len, d.max_tokens, d.window_rows, grow)
    if ahead <= cap:
        return Room("run", d.session_id, d.window_rows)
    largest = max(capacities)
    # Waits only ever go to a larger session, and the largest always qualifies, so a paused
    # stream resumes once one frees.
    target = _smallest(capacities, free_ids, min(ahead, largest), above=cap)
    if target is not None:
        return Room("move", target, min(d.window_rows, capacities[target] - d.committed))
    if d.committed < cap:
        return Room("run", d.session_id, min(d.window_rows, cap - d.committed))
    return Room("pause" if cap < largest else "end", d.session_id, 0)


def rooms(
    demands: Mapping[int, Demand], capacities: Sequence[int], free_ids: Collection[int], grow: int
) -> dict[int, Room]:
    """`room` for every stream, in the mapping's order (stream_id -> Demand); a move takes its
    target out of the free set for the streams after it. A moved stream's old session frees
    only after the round, once its state is copied."""
    free = set(free_ids)
    out: dict[int, Room] = {}
    for stream_id, demand in demands.items():
        verdict = room(demand, capacities, free, grow)
        if verdict.action == "move":
            free.discard(verdict.session_id)
        out[stream_id] = verdict
    return out


def _ahead(committed: int, prompt_len: int, max_tokens: int, window_rows: int, grow: int) -> int:
    """Positions a session must hold for the stream's next stretch: its prompt and the next
    grow margin (at least one window), capped at the reply's end."""
    start = max(committed, prompt_len)
    return min(
        reply_end(prompt_len, max_tokens, window_rows),
        _checked_sum(start, max(grow, window_rows)),
    )


def _smallest(
    capacities: Sequence[int], free_ids: Collection[int], need: int, above: int
) -> int | None:
    fitting = [i for i in free_ids if capacities[i] >= need and capacities[i] > above]
    return min(fitting, key=lambda i: (capacities[i], i), default=None)


def _count(digits: str, label: str) -> int:
    # Refuse before int(): a long digit string is an overflow, not a huge session.
    if not digits.isascii() or not digits.isdigit():
        raise ValueError(f"{label} {digits!r} is not a token count")
    if len(digits) > len(str(MAX_TOKENS)) or int(digits) > MAX_TOKENS:
        raise ValueError(f"{label} {digits} overflows (at most {MAX_TOKENS})")
    return int(digits)


def _checked_sum(*terms: int) -> int:
    total = sum(terms)
    if any(t < 0 for t in terms) or total > MAX_TOKENS:
        raise ValueError(f"token counts {terms} sum past {MAX_TOKENS} (or one is negative)")
    return total
