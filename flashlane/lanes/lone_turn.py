"""A host round given to the lone driver (runner/lone.py) instead of the lane core.

When one stream is live, nothing waits, and it decodes greedily without logprobs or a thinking
budget, the host lets the lone driver run its next steps on the device. Each landed
token goes through the same stop rules as a shared round's; the driver stops after a landed
step when the reply ends, its budget or room is spent, or the host is interrupted (work
arrived), and the stream is then exactly where shared rounds would have left it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from flashlane.lanes.core import RoundFailed
from flashlane.lanes.stops import conclude
from flashlane.lanes.stream import Stream
from flashlane.sampling.choose import DrawSpec, is_plain_greedy

if TYPE_CHECKING:
    from flashlane.lanes.host import LaneHost


def lone_stream(host: LaneHost, running: Sequence[Stream]) -> Stream | None:
    """The stream the lone driver may take this round, if any."""
    if host.lone is None or host.waiting or len(running) != 1 or len(host.live) != 1:
        return None
    s = running[0]
    # A drafting stream too: a lone step costs less than a drafted shared round gains (tiny
    # model on the H200: 6.3x one stream's shared rounds), and drafts change no token. Its
    # steps' cells are queued for its MTP head, so drafting resumes in shared rounds.
    if (s.is_filling or s.is_finished or s.forced or s.is_thinking or s.logprobs is not None
            or s.room < 1):
        return None
    return s if is_plain_greedy(DrawSpec(s.params, s.seed, s.start)) else None


def run_lone(host: LaneHost, s: Stream) -> None:
    """Decode `s` on the lone driver for up to `lone_steps` steps."""

    def take(token: int, finite: bool) -> bool:
        if s.is_finished:
            return False  # a step launched before the end was read: not the reply's
        if not finite:
            s.end("error", "sampling failed: the row has no finite logit")
            return False
        conclude(s, [token], host.rules)
        s.num_rounds += 1
        return not s.is_finished and not host.interrupted()

    budget = min(host.config.lone_steps, s.params.max_tokens - len(s.reply_ids), s.room)
    s.held = None  # drafts held for a shared window: the lone steps make them stale
    try:
        host.lone.decode(s.session_id, s.reply_ids[-1], s.start, budget, take, s.stream_id,
                         s.draws)
    except Exception as exc:  # a failed step ends this stream, not the host
        raise RoundFailed([s.stream_id], f"{type(exc).__name__}: {exc}") from exc
