"""Rank 0's backend calls, replayed on every other rank.

The lane core and its host live on rank 0 only. Each call that changes a backend's state
(verify, keep, draft, move, release and the prompt cache's keep_state, resume, drop_state) is
broadcast before rank 0 makes it, and every other rank makes the same call on its own
ModelBackend (its shards, its sessions' heads): the same forwards in the same order, so the
collectives inside them meet. Each rank draws with the keyed sampler from the same gathered
logits, so the draws agree without a message; rank 0's are the ones the host takes.

A window's Draws carry the stream's own id lists, which grow between calls (the core appends
the pending token before `keep`; the drafter reads them at `draft`). Rather than the whole
lists each round, rank 0 sends what each tracked stream's lists gained since the last call,
and the other ranks keep mirrors that their backend's windows share, as rank 0's do.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from flashlane.lanes.records import CostTable, Draws, Window
from flashlane.parallel.group import TensorParallel

logger = logging.getLogger("flashlane")


@dataclass(frozen=True, slots=True)
class Call:
    """One replayed backend call. `new`: streams first seen, stream_id -> (params, seed);
    `grown`: stream_id -> (prompt ids from, their tail, reply ids from, their tail)."""

    method: str
    args: tuple
    new: dict[int, tuple[Any, int]] = field(default_factory=dict)
    grown: dict[int, tuple[int, list[int], int, list[int]]] = field(default_factory=dict)


@dataclass(slots=True)
class _Sent:
    draws: Draws  # the stream's own (rank 0's lists)
    num_prompt: int = 0  # ids the other ranks hold
    num_reply: int = 0
    last_reply: int | None = None  # the last reply id they hold (a replaced tail resends all)


class ReplayedBackend:
    """Rank 0's Backend: each state-changing call broadcast, then made on its own backend."""

    def __init__(self, inner, tp: TensorParallel):
        self.inner, self.tp = inner, tp
        self.sent: dict[int, _Sent] = {}

    @property
    def drafter(self):
        return self.inner.drafter

    def costs(self) -> CostTable:
        return self.inner.costs()

    def set_costs(self, costs: CostTable) -> None:
        self.inner.set_costs(costs)

    def kept_bytes(self, stream_id: int) -> int:
        return self.inner.kept_bytes(stream_id)  # a question: every rank's answer is the same

    def verify(self, windows: Sequence[Window]):
        new = {}
        for w in windows:
            known = self.sent.get(w.stream_id)
            if known is None or known.draws is not w.draws:
                self.sent[w.stream_id] = _Sent(w.draws)
                new[w.stream_id] = (w.draws.params, w.draws.seed)
        light = [replace(w, draws=Draws(w.draws.params, w.draws.seed, (), ())) for w in windows]
        self._send("verify", (light,), new)
        return self.inner.verify(windows)

    def keep(self, kept: Mapping[int, int]) -> None:
        self._send("keep", (dict(kept),))
        return self.inner.keep(kept)

    def draft(self, depths: Mapping[int, int]):
        self._send("draft", (dict(depths),))
        return self.inner.draft(depths)

    def move(self, stream_id: int, session_id: int) -> None:
        self._send("move", (stream_id, session_id))
        return self.inner.move(stream_id, session_id)

    def release(self, stream_id: int, keep_prompt_state: bool = False) -> None:
        self._send("release", (stream_id, keep_prompt_state))
        self.sent.pop(stream_id, None)
        return self.inner.release(stream_id, keep_prompt_state)

    def keep_state(self, stream_id: int, entry_id: int) -> tuple[int, bool]:
        self._send("keep_state", (stream_id, entry_id))
        return self.inner.keep_state(stream_id, entry_id)

    def resume(self, stream_id: int, session_id: int, entry_id: int) -> int:
        self._send("resume", (stream_id, session_id, entry_id))
        return self.inner.resume(stream_id, session_id, entry_id)

    def drop_state(self, entry_id: int) -> None:
        self._send("drop_state", (entry_id,))
        return self.inner.drop_state(entry_id)

    def close(self) -> None:
        """Tell the other ranks the engine is done (they leave `serve`)."""
        self.tp.broadcast(None)

    def _send(self, method: str, args: tuple, new: dict | None = None) -> None:
        grown = {}
        for sid, s in self.sent.items():
            prompt, reply = s.draws.prompt_ids, s.draws.reply_ids
            same_tail = s.num_reply <= len(reply) and (
                s.num_reply == 0 or reply[s.num_reply - 1] == s.last_reply
            )
            r0 = s.num_reply if same_tail else 0
            p0 = min(s.num_prompt, len(prompt))
            if p0 == len(prompt) == s.num_prompt and r0 == len(reply) == s.num_reply:
                continue
            grown[sid] = (p0, list(prompt[p0:]), r0, list(reply[r0:]))
            s.num_prompt, s.num_reply = len(prompt), len(reply)
            s.last_reply = reply[-1] if reply else None
        self.tp.broadcast(Call(method, args, new or {}, grown))


def serve(backend, tp: TensorParallel) -> int:
    """A non-zero rank's loop: make each call rank 0 broadcasts on `backend`, until rank 0
    closes. A call's error is rank 0's too (the same state, the same inputs): its host ends
    the streams concerned and the calls that follow say so here as well. Returns the number
    of calls made."""
    mirrors: dict[int, Draws] = {}
    made = 0
    while (call := tp.broadcast()) is not None:
        for sid, (params, seed) in call.new.items():
            mirrors[sid] = Draws(params, seed, [], [])
        for sid, (p0, prompt, r0, reply) in call.grown.items():
            d = mirrors[sid]
            d.prompt_ids[p0:] = prompt
            d.reply_ids[r0:] = reply
        args = call.args
        if call.method == "verify":
            args = ([replace(w, draws=mirrors[w.stream_id]) for w in args[0]],)
        try:
            getattr(backend, call.method)(*args)
        except Exception as err:  # rank 0 raised the same and handles it
            logger.warning(
                "rank %d: %s failed: %s: %s", tp.rank, call.method, type(err).__name__, err
            )
        if call.method == "release":
            mirrors.pop(args[0], None)
        made += 1
    return made
