"""The depth rule's prices (runner/lone_draft.py's Drafting): each stream's expected tokens a
drafted step from its own landing and everyone's, the drafted steps until a batch's slowest
reply ends, the nearest step costs measured, and whether a drafted try goes on. A mixin: the
rule's state (stats, by_stream, replies, depth, driver) is Drafting's."""

from __future__ import annotations

import math

from flashlane.lanes.stream import DraftStats
from flashlane.runner.draft_step import priced

# drafts of everyone's landing beside a stream's own (`_expected`), and the fewest replies
# kept that tell a spread of landing (`_slowest`)
STREAM_PRIOR, FEW_REPLIES = 8, 8


class Prices:
    def _expected(self, stream_ids: list) -> list[float]:
        """Each stream's expected tokens a drafted step (1 + its drafts' chance of landing,
        chained): the landing of its own drafted steps so far (`by_stream`), leaning on every
        stream's (`stats`) by STREAM_PRIOR drafts at each depth."""
        return [self._expected_of(self.by_stream.get(sid)) for sid in stream_ids]

    def _expected_of(self, own: DraftStats | None) -> float:
        landing, expected = 1.0, 1.0
        for d in range(self.depth):
            rate = self.stats.rate(d + 1)
            if own is not None and len(own.offered) > d:
                rate = (own.accepted[d] + STREAM_PRIOR * rate) / (own.offered[d] + STREAM_PRIOR)
            landing *= rate
            expected += landing
        return expected

    def _slowest(self, stream_ids: list, lefts: list, expected: list[float]) -> tuple:
        """(drafted steps until the last of the call's replies has its `lefts` (all known),
        whether a landing is guessed): each stream at its own landing, one with none of its
        own at the landing the slowest of as many new streams had among the last `replies`
        (their 1 / (k + 1) quantile): a batch lasts as long as its slowest reply (16 on the
        H100, ddb225a: landing 0.25-0.93). A guess drafts a try (`_better`) if it gains more
        than the try loads: the last replies may be other text (H100, 817e2e1: 16 streams
        after 4 drafted three calls in five, 0.88 on / off)."""
        own = [self.by_stream.get(sid) for sid in stream_ids]
        new = [i for i, o in enumerate(own) if o is None or not o.offered]  # none measured
        need = [left / e for left, e in zip(lefts, expected)]
        if new and len(self.replies) >= FEW_REPLIES:  # at most everyone's landing
            past = sorted(self.replies.values())
            e = min(past[min(len(past) - 1, len(past) // (len(new) + 1))], expected[new[0]])
            need += [lefts[i] / e for i in new]
        return math.ceil(max(need)), bool(new)

    def _measured(self, b: int) -> tuple:
        """(the nearest session count measured both ways, its plain and drafted step ms):
        steps of a few sessions cost about the same."""
        drv = self.driver
        measured = {n for n, d in drv.step_ms if d == 0}
        measured &= {n for n, d in drv.step_ms if d == self.depth}
        near = min(measured, key=lambda n: (abs(n - b), n), default=b)
        return near, *(drv.step_ms.get((near, d)) for d in (0, self.depth))

    def _goes_on(self, b: int, steps: int, lefts: list, stream_ids: list) -> bool:
        """Whether a drafted try goes on past its PROBE_STEPS (a call boundary less, ~2% of
        a one-stream reply on the H100): its drafted steps, priced on the streams' own
        landing now measured and with no load, still cost less a token than a new plain
        call, and end the replies sooner where their tokens are known."""
        near, plain, drafted = self._measured(b)
        if plain is None or drafted is None or steps <= 0:
            return steps > 0
        load, expected = self.driver.load_ms.get((near, 0), 0.0), self._expected(stream_ids)
        if priced(0.0, drafted, steps, lefts, expected) >= priced(
            load, plain, steps, lefts, [1.0] * b
        ):
            return False
        if max(lefts) == math.inf:
            return True
        return self._slowest(stream_ids, lefts, expected)[0] * drafted < load + max(lefts) * plain
