"""The Backend protocol: what the lane core asks of a model runner each round (DESIGN.md 3).

A round calls, in order: `verify` once (every live window and prompt piece in ONE target
forward), `keep` once (the rows each stream keeps), then `draft` once (MTP drafts for the
drafting streams), with `move` and `release` between rounds. Records and position conventions
are in `flashlane.lanes.records`.

Errors. `verify` checks the whole batch before it changes any state and raises
`InvalidBatch` for an empty window, a stream twice, too many rows, a window past its session's
context or an unknown session. A failure that belongs to one stream (a NaN logit, a row with no
candidate) comes back in that stream's Verdict (or Drafts) and ends only it. Any other exception
from `verify`, `keep` or `draft` is an error of the whole call: the host ends the streams in it
(`fail_all`) and releases their sessions, and the engine goes on, so `release` must work on a
stream whose last call failed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from flashlane.lanes.records import CostTable, Drafts, Verdict, Window


class Backend(Protocol):
    def verify(self, windows: Sequence[Window]) -> list[Verdict]:
        """One target forward over all windows; the keyed draw at every drawing row.

        Returns one Verdict per window, in the windows' order. Each window's rows are fed
        tentatively: nothing is committed until `keep`.
        """
        ...

    def keep(self, kept: Mapping[int, int]) -> None:
        """Commit rows of the last verify: stream_id -> rows kept (rows 0..n-1 of its window);
        roll back the rest exactly (every state kind, DESIGN.md 3).

        A decode window keeps at least row 0; a prompt piece keeps all its rows. Every window of
        the last verify whose verdict carried no error has an entry (a stream that just finished
        too, released after); a stream left out (its verdict failed) keeps nothing and is
        released next. When keep is called, the `Draws.reply_ids` of each decode window and last
        prompt piece already ends with the stream's new pending token: the draw after its last
        kept row, or the forced token that replaced that draw (a thinking close), so read the
        pending token there, not from `sampled`.
        """
        ...

    def draft(self, depths: Mapping[int, int]) -> list[Drafts]:
        """MTP drafts for streams after `keep`: stream_id -> depth (at least 1).

        The head absorbs the rows each stream kept since its last draft call (rewinding past the
        drafts it made then), then chains up to `depth` drafts, each keyed at
        its own position with the stream's params and seed (the Draws of its last window); the
        first draft is always kept, a later one below the confidence threshold ends the chain.
        The drafts are for positions start' + 1.., where start' is the stream's new committed
        length; its pending token (at start', drawn or forced, not fed yet) is the last of the
        `reply_ids` of its window's Draws. Returns one Drafts per requested stream.
        """
        ...

    def move(self, stream_id: int, session_id: int) -> None:
        """Copy the stream's whole state into a free session and bind it there."""
        ...

    def release(self, stream_id: int, keep_prompt_state: bool) -> None:
        """Unbind the stream and free its session. `keep_prompt_state`: the runner may keep the
        prompt's state for its prompt cache before freeing. A stream that never ran a window (or
        is unknown) releases as a no-op; a release after a failed call must still free."""
        ...

    def kept_bytes(self, stream_id: int) -> int:
        """What `keep_state` of the stream would take now (the prompt cache makes room first)."""
        ...

    def keep_state(self, stream_id: int, entry_id: int) -> tuple[int, bool]:
        """Copy the stream's committed state (its length is a mark) for the prompt cache under
        `entry_id`; returns (bytes taken, whether the MTP head's state was kept too)."""
        ...

    def resume(self, stream_id: int, session_id: int, entry_id: int) -> int:
        """Bind a stream that has run no window to a free session and put the kept state there;
        returns the state's length, where the stream's next prompt piece starts."""
        ...

    def drop_state(self, entry_id: int) -> None:
        """Free a kept state (evicted); unknown ids are ignored."""
        ...

    def costs(self) -> CostTable:
        """The cost table timed at load (fixed for the engine's life)."""
        ...


class LoneDriving(Protocol):
    """What the host asks of the lone driver (runner/lone.py: the decoding streams' rounds as
    device-side steps; lanes/lone_turn.py says when)."""

    sampled: bool  # whether it takes sampled streams (else greedy ones only)
    most_drafted: int  # the most streams a drafted call takes (0: it drafts none)

    def decode_many(
        self,
        session_ids: list[int],
        tokens: list[int],
        positions: list[int],
        budget: int,
        takes: list[Callable[[int, bool], bool]],
        stream_ids: list[int],
        draws: list[Any],
        ends: Callable[[list[bool]], bool] = any,
    ) -> int:
        """Up to `budget` steps of these sessions from their pending tokens at their
        positions; each landed token goes to its stream's take(id, finite), and once `ends`
        says so of which takes have said no (default: any), the step in flight lands too.
        Returns the steps the sessions now hold."""
        ...

    def decode_drafted(
        self,
        session_ids: list[int],
        tokens: list[int],
        positions: list[int],
        budget: int,
        room: int,
        takes: list[Callable[[int, bool], bool]],
        stream_ids: list[int],
        draws: list[Any],
        hints: list[list[int]] | None = None,
        left: int | None = None,
        ends: Callable[[list[bool]], bool] = any,
    ) -> tuple[list[int], list[int]] | None:
        """decode_many in drafted steps where the driver drafts these (greedy, drafting)
        streams and finds it pays: (drafts made, drafts landed), per stream before its take
        said no, else None and nothing ran. hints: each stream's guesses at its next tokens
        (its copy drafts), for a first step that has no drafts of the driver's own; left:
        the most tokens a reply still wants, over which a drafted call's load is priced."""
        ...

    def lag(self, stream_ids: list[int]) -> None:
        """These drafting streams' next call takes more than most_drafted: their MTP heads
        queue no cells from now on, and they draft no more in their replies."""
        ...

    def step_seconds(self, b: int) -> float | None:
        """A plain step's measured time for b sessions, None before any."""
        ...
