"""Which session each live stream holds: admission, room before a round (move, pause, end) and
release. The choices are `flashlane.sessions.slots`'s; this module applies them to streams and
the backend."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from flashlane.lanes.protocol import Backend
from flashlane.lanes.stream import Stream
from flashlane.sessions.slots import (
    DEFAULT_GROW,
    Demand,
    check_admissible,
    choose_session,
    max_model_len,
    rooms,
)

log = logging.getLogger(__name__)


class SessionPool:
    def __init__(self, capacities: Sequence[int], grow: int | None, window_rows: int) -> None:
        if not capacities:
            raise ValueError("the host needs at least one session")
        self.capacities = tuple(capacities)
        self.grow = DEFAULT_GROW if grow is None else grow
        self.window_rows = window_rows  # the most rows a decode window takes
        self.free: set[int] = set(range(len(self.capacities)))

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def max_model_len(self) -> int:
        """The most prompt + reply tokens a request may ask for (slots.max_model_len)."""
        return max_model_len(self.capacities, self.window_rows)

    def check(self, prompt_len: int, max_tokens: int) -> None:
        """Raises NoSessionFits for a request that no session could ever hold."""
        check_admissible(self.capacities, prompt_len, max_tokens, self.window_rows, self.grow)

    def allocate(self, prompt_len: int, max_tokens: int) -> int | None:
        """A free session for a new stream, taken; None while none that fits is free."""
        session_id = choose_session(
            self.capacities, self.free, prompt_len, max_tokens, self.window_rows, self.grow
        )
        if session_id is not None:
            self.free.discard(session_id)
        return session_id

    def claim(self, session_id: int) -> None:
        """Take a given session (a stream handed over with its state already there)."""
        if session_id not in self.free:
            raise ValueError(f"session {session_id} is not free")
        self.free.discard(session_id)

    def release(self, backend: Backend, stream: Stream) -> None:
        """Free the stream's session. It frees even when the backend fails to release it: the
        backend starts a session afresh when its next stream binds it."""
        keep_prompt_state = stream.error is None and not stream.is_filling
        try:
            backend.release(stream.stream_id, keep_prompt_state)
        except Exception:  # a failed release must not keep a session from coming back
            log.exception("release of stream %d failed", stream.stream_id)
        self.free.add(stream.session_id)

    def make_room(self, backend: Backend, live: Sequence[Stream]) -> list[tuple[Stream, str]]:
        """Before a round: move streams short of room to a larger free session, pause those that
        must wait for one; returns the streams to end, with their finish reason."""
        decoding = [s for s in live if not s.is_filling and not s.is_finished]
        demands = {
            s.stream_id: Demand(
                s.session_id, s.start, len(s.prompt_ids), s.params.max_tokens, self.window_rows
            )
            for s in decoding
        }
        verdicts = rooms(demands, self.capacities, self.free, self.grow)
        ended: list[tuple[Stream, str]] = []
        for s in decoding:
            room = verdicts[s.stream_id]
            was_paused, s.is_paused = s.is_paused, room.action == "pause"
            s.num_preempted += s.is_paused and not was_paused
            s.num_pauses += s.is_paused
            if room.action == "end":
                ended.append((s, "length"))
            elif room.action == "move" and not self._move(backend, s, room.session_id):
                ended.append((s, "error"))
        return ended

    def _move(self, backend: Backend, s: Stream, session_id: int) -> bool:
        try:
            backend.move(s.stream_id, session_id)
        except Exception as exc:  # the move's failure is this stream's alone
            s.end("error", f"moving to session {session_id} failed: {type(exc).__name__}: {exc}")
            return False
        self.free.discard(session_id)
        self.free.add(s.session_id)
        s.session_id, s.capacity = session_id, self.capacities[session_id]
        s.num_moves += 1
        return True
