"""The depth rule: how many MTP drafts a stream asks of its next chain.

The depth with the best expected tokens per millisecond for the stream's own window, from its
measured acceptance per depth (a half while unmeasured, so a fresh stream reaches for depth),
the forward's time at 1 + d rows and the chain steps past the first (priced as `allocate`
prices them). Every PROBE_EVERY rounds it asks one deeper than the best, so the rate one past
it is measured again: acceptance drifts with the text.
Depth 0 means no draft call this round; the probe still asks for one.
"""

from __future__ import annotations

from flashlane.lanes.records import CostTable
from flashlane.lanes.stream import DraftStats

PROBE_EVERY = 8


def choose_depth(
    stats: DraftStats, costs: CostTable | None, max_depth: int, num_rounds: int
) -> int:
    """Depth 0..max_depth for the next chain; `costs` None (unpriced): always `max_depth`."""
    if costs is None or max_depth <= 0:
        return max(0, max_depth)
    best = best_depth(stats, costs, max_depth)
    if num_rounds % PROBE_EVERY == PROBE_EVERY - 1:
        return min(max_depth, best + 1)
    return best


def best_depth(stats: DraftStats, costs: CostTable, max_depth: int) -> int:
    best, best_rate = 0, _rate(0, 1.0, costs)
    expected, landing = 1.0, 1.0
    for d in range(1, max_depth + 1):
        landing *= stats.rate(d)
        expected += landing
        rate = _rate(d, expected, costs)
        if rate > best_rate:
            best, best_rate = d, rate
    return best


def _rate(depth: int, expected: float, costs: CostTable) -> float:
    ms = costs.forward_ms(1 + depth) + costs.overhead_ms + costs.draft_step_ms * max(0, depth - 1)
    return expected / ms if ms > 0 else expected
