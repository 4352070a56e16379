"""The records that cross the lane core's boundary with a backend (DESIGN.md section 3).

Positions are 0-based sequence indices; a prompt of length L occupies 0..L-1.

Decode windows. After its prompt a stream's window starts at `start`, its committed length
(the positions whose state the session holds). Row 0 is the pending token (drawn last round,
not yet fed) at position `start`; rows 1.. are drafts or forced tokens. Row r holds the token
at `start + r` and draws the token for position `start + r + 1`; every row draws.

Prompt pieces. A prompt is fed in pieces that start at multiples of C = 64 and are multiples of
C long, except a prompt's last piece (a prompt resumed from a cached state starts its first
piece at the cached length and ends it on the grid). Row r of a piece holds the prompt token at
`start + r`. A piece draws only at its last row, and only if `last_piece`: that draw is the
first reply token, for position L.

Drawing. Every drawing row uses the keyed sampler (DESIGN.md section 5) with the stream's
`Draws`: its params, its seed, and the ids seen so far. The ids seen before the draw at row r of
a decode window are `prompt_ids + reply_ids + tokens[1 : r + 1]` (reply_ids already ends with
the pending token, row 0); for a prompt piece's last row they are `prompt_ids`. Penalty counts
over "the reply so far" are `reply_ids + tokens[1 : r + 1]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

# The GDN chunk size; prompt pieces start on this grid (DESIGN.md section 3). It is the
# prompt cache's mark grid too, which sessions/ (below the lane core) defines.
from flashlane.sessions.prompt_cache import CHUNK as CHUNK

if TYPE_CHECKING:
    from flashlane.request import SamplingParams

WindowKind = Literal["decode", "prompt"]


class InvalidBatch(ValueError):
    """A verify batch the backend refuses before changing any state: an empty window, a stream
    twice, too many rows, a window past its session's context, an unknown session."""


@dataclass(frozen=True, slots=True)
class Draws:
    """What a backend needs to draw a stream's tokens. `prompt_ids` and `reply_ids` are the
    stream's own lists, shared, not copied: read them during the call that receives the window;
    they grow after it returns."""

    params: SamplingParams
    seed: int  # already reduced modulo 2**63 (DESIGN.md section 5)
    prompt_ids: Sequence[int]
    reply_ids: Sequence[int]  # every reply token so far, the pending one (row 0) last


@dataclass(frozen=True, slots=True)
class Window:
    """One stream's rows in a round's verify forward (module docstring: positions, drawing)."""

    stream_id: int
    session_id: int  # a stream is bound to its session by its first window, until release/move
    start: int  # position of row 0
    tokens: tuple[int, ...]  # row r holds tokens[r] at position start + r
    draws: Draws
    kind: WindowKind = "decode"
    last_piece: bool = False  # prompt pieces only: this piece ends the prompt and draws once

    @property
    def num_rows(self) -> int:
        return len(self.tokens)

    @property
    def num_draws(self) -> int:
        """How many tokens the verdict must carry for this window."""
        if self.kind == "decode":
            return len(self.tokens)
        return 1 if self.last_piece else 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """A window's result. `sampled[r]` is the draw of row r (the token for position
    start + r + 1); a prompt piece has one draw (its last row) if it ends the prompt, else none.
    An error belongs to this stream alone and ends it; `sampled` is then ignored."""

    stream_id: int
    sampled: list[int]
    # One dict per draw, id -> logprob: the top `params.logprobs` ids and the sampled one.
    logprobs: list[dict[int, float]] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Drafts:
    """MTP drafts for the positions after a stream's pending token, in order."""

    stream_id: int
    tokens: list[int]
    probs: list[float]  # the head's probability of each drafted token, for pricing
    error: str | None = None  # this stream's draft failed; it ends alone


@dataclass(frozen=True, slots=True)
class CostTable:
    """Round costs timed on the real backend at load (tests inject one)."""

    verify_ms: dict[int, float]  # rows in the forward -> ms, for 1..max_rows, one row per stream
    draft_step_ms: float  # one MTP chain step for all drafting streams together
    overhead_ms: float  # the rest of a round: planning, packing, host work
    # Each window width past the first in a round: the recurrent layers run the windows of
    # each width as one stacked call, so a round of unequal windows makes one call per width.
    group_ms: float = 0.0
    # Each drafting stream past the first adds this to an MTP chain step (the head's rows).
    draft_stream_ms: float = 0.0
    # Each waiting cell the MTP head absorbs in a draft call past the one or two of a stream
    # that drafted last round: what a stream that has not drafted for a while pays to catch up.
    absorb_cell_ms: float = 0.0

    def chain_ms(self, num_steps: int, num_streams: int = 1) -> float:
        """MTP chain steps run for `num_streams` drafting streams together."""
        return num_steps * (self.draft_step_ms + self.draft_stream_ms * max(0, num_streams - 1))

    def shape_ms(self, num_rows: int, num_widths: int = 1) -> float:
        """Verify time of a round of `num_rows` rows in windows of `num_widths` distinct
        widths (DESIGN.md section 4: a round is priced by its shape, not its rows alone)."""
        return self.forward_ms(num_rows) + self.group_ms * max(0, num_widths - 1)

    def forward_ms(self, num_rows: int) -> float:
        """Verify time at `num_rows`: the table's entry, else linear between (or past) the
        nearest entries."""
        if num_rows in self.verify_ms:
            return self.verify_ms[num_rows]
        known = sorted(self.verify_ms)
        if not known:
            return 0.0
        if num_rows < known[0] or len(known) == 1:
            return self.verify_ms[known[0]] * max(1.0, num_rows / known[-1])
        below = [n for n in known if n < num_rows]
        lo = below[-1] if len(below) < len(known) else known[-2]
        hi = known[known.index(lo) + 1]
        slope = (self.verify_ms[hi] - self.verify_ms[lo]) / (hi - lo)
        return self.verify_ms[lo] + slope * (num_rows - lo)
