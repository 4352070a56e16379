"""The depth rule: how many MTP drafts a stream asks of its next chain.

The depth whose drafts raise the next round's expected tokens per millisecond the most, from
the stream's measured acceptance per depth (a half while unmeasured, so a fresh stream reaches
for depth), the forward's growth past the rows the round carries anyway, and all d chain steps
(the first is the head's absorb of the kept rows; `allocate` prices only steps past the first,
the drafts being made by then). Every PROBE_EVERY rounds it asks one deeper than the best, so
the rate one past it is measured again: acceptance drifts with the text.
Depth 0 means no draft call this round; the probe still asks for one.
"""

from __future__ import annotations

from flashlane.lanes.records import CostTable
from flashlane.lanes.stream import DraftStats

PROBE_EVERY = 8


def choose_depth(
    stats: DraftStats,
    costs: CostTable | None,
    max_depth: int,
    num_rounds: int,
    round_rows: int = 1,
) -> int:
    """Depth 0..max_depth for the next chain; `costs` None (unpriced): always `max_depth`.
    `round_rows`: the plain rows the next round carries anyway (one per decoding stream)."""
    if costs is None or max_depth <= 0:
        return max(0, max_depth)
    best = best_depth(stats, costs, max_depth, round_rows)
    if num_rounds % PROBE_EVERY == PROBE_EVERY - 1 and _could_pay(best + 1, costs, round_rows):
        return min(max_depth, best + 1)
    return best


def _could_pay(depth: int, costs: CostTable, round_rows: int) -> bool:
    """Whether drafts that surely land would raise the round's rate at this depth: when even
    they would not (a round already full of rows), a probe measures nothing and is not made."""
    base = max(1, round_rows)
    return _rate(base, depth, float(base + depth), costs) > _rate(base, 0, float(base), costs)


def best_depth(stats: DraftStats, costs: CostTable, max_depth: int, round_rows: int = 1) -> int:
    """The depth whose drafts raise the whole round's tokens per ms the most: the stream's
    expected extra tokens against the forward's growth past `round_rows` and the chain steps
    (the allocator prices the round the same way, so drafts it would refuse are not made)."""
    base = max(1, round_rows)
    best, best_rate = 0, _rate(base, 0, float(base), costs)
    expected, landing = float(base), 1.0
    for d in range(1, max_depth + 1):
        landing *= stats.rate(d)
        expected += landing
        rate = _rate(base, d, expected, costs)
        if rate > best_rate:
            best, best_rate = d, rate
    return best


def _rate(rows: int, depth: int, expected: float, costs: CostTable) -> float:
    # every chain step is paid, the first too: it is the head's absorb of the kept rows
    ms = costs.forward_ms(rows + depth) + costs.overhead_ms + costs.draft_step_ms * depth
    return expected / ms if ms > 0 else expected
