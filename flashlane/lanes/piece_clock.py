"""How many prompt rows a round takes while replies decode, from the rounds' measured times.

A long prompt's pieces share rounds with decoding streams (chunked prefill). Each round's
pieces delay every decoder's next tokens, so the clock sizes them: a round with pieces
should take at most `stall` times a round without them (issue 29: a decoder's inter-token
gap p99 at most 3x its gap without the prompt; 2.5 leaves room for noise).

It learns, as rounds run, `plain` (a moving average of the seconds of a round with decoders
and no pieces) and a line through the rounds with pieces, seconds = base + per_row x rows
(least squares over a moving average per piece size). `base`, what such a round costs
before its first row, is at least `plain`; it is far above it where decoders on the lone
driver (a step of a few ms) sit beside a shared round (hundreds of ms on the real model,
whatever its rows). There the stall cannot hold at any size, and pieces of one chunk would
only multiply the rounds that break it (sixteen 128-token prompts took 32 such rounds and
15 s on the H200): a round then takes `stall` times its base. So the limit is `stall` x
max(plain, base), and the rows fill what the line leaves below it.

Until the line is known a round takes one chunk. With one size measured, a round within the
limit gives the line through `plain` (base = plain); one past it, or one without a plain
round to compare, sends the next round with twice the rows: two sizes give the line.
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
        self.by_rows: dict[int, float] = {}  # piece rows -> seconds of such a round

    def record(self, seconds: float, piece_rows: int) -> None:
        """A round that ran while replies decode: its seconds and its prompt rows."""
        if piece_rows == 0:
            self.plain = _moved(self.plain, seconds)
        else:
            self.by_rows[piece_rows] = _moved(self.by_rows.get(piece_rows), seconds)

    def line(self) -> tuple[float, float] | None:
        """(base, per_row) in seconds, or None while the rounds measured do not give it."""
        floor = self.plain or 0.0
        if len(self.by_rows) >= 2:
            n = len(self.by_rows)
            mx = sum(self.by_rows) / n
            my = sum(self.by_rows.values()) / n
            var = sum((x - mx) ** 2 for x in self.by_rows)
            slope = sum((x - mx) * (y - my) for x, y in self.by_rows.items()) / var
            slope = max(slope, 0.0)
            return max(my - slope * mx, floor), slope
        if len(self.by_rows) == 1 and self.plain is not None:
            ((rows, seconds),) = self.by_rows.items()
            if seconds <= self.stall * self.plain:
                return self.plain, max(seconds - self.plain, 0.0) / rows
        return None

    def rows(self, most: int) -> int:
        """Prompt rows for the next round with decoders, on the chunk grid, at least one
        chunk and at most `most`."""
        line = self.line()
        if line is None:
            if not self.by_rows:
                return min(most, CHUNK)
            (rows,) = self.by_rows  # a second size for the line
            return min(most, max(CHUNK, 2 * rows // CHUNK * CHUNK))
        base, per_row = line
        limit = self.stall * max(self.plain or 0.0, base)
        if per_row <= 0.0:
            return max(min(most, CHUNK), most // CHUNK * CHUNK)
        fit = int((limit - base) / per_row) // CHUNK * CHUNK
        return max(min(most, CHUNK), min(most, fit))


def _moved(average: float | None, value: float) -> float:
    return value if average is None else (1.0 - WEIGHT) * average + WEIGHT * value
