"""How many prompt rows a round takes while replies decode, from the rounds' measured times.

A long prompt's pieces share rounds with decoding streams (chunked prefill). Each round's
pieces delay every decoder's next tokens, so the clock sizes them: a round with pieces
should take at most `stall` times a round without them (issue 29: a decoder's inter-token
gap p99 at most 3x its gap without the prompt; 2.5 leaves room for noise). It learns two
figures as rounds run, each a moving average: `plain`, the seconds of a round with decoders
and no pieces, and `per_row`, the seconds a piece row adds to a round with decoders. Until
both are known a round takes one chunk, so the first measure costs the decoders little; the
pieces then grow to what the room allows (a larger piece costs less a row: the sizes climb
to where the clock's room ends or to `most`).

Decoders on the lone driver deliver a call of steps at a time, and a call ends early when
work arrives (a prompt's pieces then run in a shared round beside them): the plain rounds
measured while requests arrive are single steps (some 7 ms on the real FP8 model), and a
shared round with any piece costs 300 ms there, whatever its rows. Measured against those
steps, every piece round was past the stall and the pieces stayed at one chunk: sixteen
128-token prompts arriving together took 32 rounds and 15 s to their first tokens. So the
host passes `plain` where it knows the decoders' round better: a whole lone call (its
steps at their measured time), and the clock takes the larger of that and its own.
"""

from __future__ import annotations

from flashlane.lanes.records import CHUNK

STALL = 2.5  # a round with pieces: at most this many rounds without them
WEIGHT = 0.3  # a new measure's weight in the moving averages


class PieceClock:
    def __init__(self, stall: float = STALL) -> None:
        if stall <= 1.0:
            raise ValueError(f"stall {stall}: a round with pieces takes longer than without")
        self.stall = stall
        self.plain: float | None = None  # seconds, a round with decoders and no pieces
        self.per_row: float | None = None  # seconds a piece row adds to such a round

    def record(self, seconds: float, piece_rows: int, plain: float | None = None) -> None:
        """A round that ran while replies decode: its seconds and its prompt rows (`plain`:
        the host's figure for a round without pieces, where it has one)."""
        if piece_rows == 0:
            self.plain = _moved(self.plain, seconds)
        elif (base := self.baseline(plain)) is not None:
            added = max(seconds - base, 0.0) / piece_rows
            self.per_row = _moved(self.per_row, added)

    def baseline(self, plain: float | None = None) -> float | None:
        """A round without pieces: the measured one, or the host's `plain` where larger."""
        if plain is None or (self.plain is not None and self.plain > plain):
            return self.plain
        return plain

    def rows(self, most: int, plain: float | None = None) -> int:
        """Prompt rows for the next round with decoders, on the chunk grid, at least one
        chunk and at most `most` (`plain` as in record)."""
        base = self.baseline(plain)
        if base is None or self.per_row is None:
            return min(most, CHUNK)
        room = (self.stall - 1.0) * base
        fit = int(room / max(self.per_row, 1e-9)) // CHUNK * CHUNK
        return max(CHUNK, min(most, fit))


def _moved(average: float | None, value: float) -> float:
    return value if average is None else (1.0 - WEIGHT) * average + WEIGHT * value
