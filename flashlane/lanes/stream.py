"""A stream: one reply in flight, its tokens, drafts, acceptance and stop state.

Positions (DESIGN.md section 3): the prompt occupies 0..L-1; reply token i sits at L + i. Once
the prompt is fed, the session holds `start` = L + len(reply) - 1 positions and the last reply
token is the pending one, fed as row 0 of the next window.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from flashlane.detok import IncrementalDetokenizer, StopMatcher
from flashlane.lanes.copy_drafts import CopyIndex
from flashlane.lanes.records import Draws

if TYPE_CHECKING:
    from flashlane.request import SamplingParams

DraftKind = Literal["mtp", "copy"]


@dataclass(slots=True)
class DraftStats:
    """Acceptance per draft depth (index 0 is depth 1) for one kind of draft. A draft at depth d
    counts as offered only when it was reached: every draft before it in its window landed."""

    offered: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    # Sum of the prior landing chances of the offered drafts (the head's own probabilities).
    expected: list[float] = field(default_factory=list)

    def is_measured(self, depth: int) -> bool:
        return len(self.offered) >= depth and self.offered[depth - 1] > 0

    def record(self, priors: list[float], num_accepted: int) -> None:
        """One window's drafts (their prior chances, in depth order) and how many landed."""
        for d, prior in enumerate(priors[: num_accepted + 1]):
            if len(self.offered) <= d:
                self.offered.append(0)
                self.accepted.append(0)
                self.expected.append(0.0)
            self.offered[d] += 1
            self.expected[d] += prior
            self.accepted[d] += d < num_accepted

    def chance(self, depth: int, prior: float) -> float:
        """The chance a reached draft at `depth` lands: its prior scaled by how this stream's
        drafts at that depth did against their priors (the prior itself while unmeasured)."""
        if not self.is_measured(depth):
            return prior
        d = depth - 1
        return min(1.0, prior * (self.accepted[d] + 1) / (self.expected[d] + 1))

    def typical(self, depth: int) -> float:
        """The chance a reached draft at `depth` of the usual prior (the mean of those offered)
        lands, as `chance` scales it; one half while unmeasured. A head whose drafts are
        unsure and miss says so after one draft, where `rate` would still be near a half."""
        if not self.is_measured(depth):
            return 0.5
        return self.chance(depth, self.expected[depth - 1] / self.offered[depth - 1])

    def rate(self, depth: int) -> float:
        """Smoothed landing rate at `depth` with no per-draft prior (one half while unmeasured)."""
        if len(self.offered) < depth:
            return 0.5
        return (self.accepted[depth - 1] + 1) / (self.offered[depth - 1] + 2)


@dataclass(frozen=True, slots=True)
class Held:
    """Drafts a stream holds for its next window."""

    kind: DraftKind
    start: int  # the stream's start when drafted; stale once the stream moves on
    tokens: tuple[int, ...]  # for positions start + 1, start + 2, ...
    priors: tuple[float, ...]  # each draft's prior landing chance (head probability, or fixed)


@dataclass(slots=True, eq=False)
class Stream:
    stream_id: int
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    seed: int  # modulo 2**63
    session_id: int
    capacity: int  # positions the session holds; the reply ends at "length" when full
    arrival: int  # admission order; prompt pieces are filled oldest first
    reply_ids: list[int] = field(default_factory=list)
    filled: int = 0  # prompt positions already in the session's state
    # Prompt-cache marks (flashlane.sessions.prompt_cache): pieces end there, states are kept.
    marks: tuple[int, ...] = ()
    num_cached: int = 0  # prompt positions resumed from the prompt cache
    # Tokens that replace the draws for the positions after the pending one (thinking close).
    forced: list[int] = field(default_factory=list)
    held: Held | None = None
    mtp: DraftStats = field(default_factory=DraftStats)
    copy: DraftStats = field(default_factory=DraftStats)
    depth: int = 1  # MTP depth asked of the next draft call
    # Its last MTP drafts were held but the allocator took none: it asks for none until a probe.
    is_refused: bool = False
    # `start` at the stream's last MTP draft call: the head has absorbed every cell before it;
    # the cells since wait for the next call (0: none yet, the whole context waits).
    absorbed: int = 0
    thinking: int = 0  # reply tokens emitted while thinking (budgeted streams only)
    is_thinking: bool = False  # a budgeted stream that has not closed its thinking yet
    # Loop guard: for each cycle length p, how many latest tokens equal the token p before them.
    cycle_runs: list[int] = field(default_factory=list)
    finish: str | None = None  # "stop" | "length" | "abort" | "error"
    error: str | None = None
    stop_string: str | None = None  # the stop string that ended the reply
    detok: IncrementalDetokenizer | None = None  # the reply's text, where the host decodes
    matcher: StopMatcher | None = None  # present when the params name stop strings
    num_final_chars: int = 0  # detok.text[:num_final_chars] can be shown: no stop string in it
    num_sent_chars: int = 0  # of that, already handed to the caller
    last_served: int = -1  # the round that last verified this stream's window
    num_delivered: int = 0  # reply tokens already handed to the caller
    num_rounds: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    num_moves: int = 0
    num_pauses: int = 0  # rounds skipped while paused
    num_preempted: int = 0  # times it began to pause (vLLM's preemptions)
    # The largest session's capacity: a stream whose session is smaller moves or pauses when
    # full instead of ending (0: its own session is the limit).
    max_capacity: int = 0
    is_paused: bool = False  # skips rounds until a larger session frees (sessions.slots.room)
    # One dict per reply token (id -> logprob), where the params ask for logprobs.
    logprobs: list[dict[int, float]] | None = None
    # time.monotonic() at admission, at the first reply token and at the end (stats only)
    submitted_at: float = 0.0
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    ended_at: float = 0.0
    copy_index: CopyIndex | None = None
    draws: Draws = field(init=False)

    def __post_init__(self) -> None:
        self.draws = Draws(self.params, self.seed, self.prompt_ids, self.reply_ids)

    @property
    def is_filling(self) -> bool:
        return self.filled < len(self.prompt_ids)

    @property
    def is_finished(self) -> bool:
        return self.finish is not None

    @property
    def start(self) -> int:
        """The committed length: the pending token's position."""
        return len(self.prompt_ids) + len(self.reply_ids) - 1

    @property
    def room(self) -> int:
        """Rows the next window may hold before the session is full."""
        return self.capacity - self.start

    def end(self, finish: str, error: str | None = None) -> None:
        if self.finish is None:
            self.finish, self.error = finish, error
            self.forced.clear()
            self.held = None
