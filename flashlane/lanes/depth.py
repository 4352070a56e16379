"""The depth rule: how many MTP drafts a stream asks of its next chain.

The depth whose drafts raise the next round's expected tokens per millisecond the most, from
the stream's measured acceptance per depth (a half while unmeasured, so a fresh stream reaches
for depth). The round is priced by its shape, as `allocate` prices it, on the assumption that
the round's other streams draft like this one: each of the `round_rows` streams carries d drafts
while the row cap leaves room (then the windows are of one width and stay one stacked call),
the rest none (one width more). All d chain steps are paid (the first is the head's absorb of
the kept rows; `allocate` prices only steps past the first, the drafts being made by then).
Those prices depend on the round, not the stream: `round_prices` makes them once a round.
Every PROBE_EVERY rounds (PROBE_IDLE_EVERY for a stream that drafts nothing) it asks one deeper
than the best, so the rate one past it is measured again: acceptance drifts with the text.
Depth 0 means no draft call this round; the probe still asks for one, unless even drafts that
land as often as good drafts do (PROBE_LANDING at each depth) would not pay for their round:
then a probe measures nothing worth knowing.

A draft call of a stream whose head has cells to catch up (`catch_up_cells`: a fresh stream's
whole prompt, or everything kept since an idle stream last drafted) pays that absorb once, and
so does the round it drafts in should its drafts not land; the call is made only where `odds`
(the chance the stream's drafts turn out good) of what good drafts would save over the rounds
its reply has left repays both. The core passes as odds the chance a first draft of the
head's usual confidence lands, from all its streams so far (`DraftStats.typical`; a half
before any): a head with random weights, unsure and wrong, stops paying for catch-ups after
its first miss; a trained one keeps measuring.
"""

from __future__ import annotations

from dataclasses import dataclass

from flashlane.lanes.records import CostTable
from flashlane.lanes.stream import DraftStats

PROBE_EVERY = 8
# A stream that drafts nothing probes this seldom: its probe is a draft call (for every stream
# probing that round) that the round would not make otherwise.
PROBE_IDLE_EVERY = 4 * PROBE_EVERY
# How often a probe supposes its drafts land at each depth: good MTP drafts, about (the
# embedded model's streams land 0.73-0.80 of theirs); sure drafts would probe rounds so full
# that only drafts that always land could pay.
PROBE_LANDING = 0.9


@dataclass(frozen=True, slots=True)
class RoundPrices:
    """A round of `round_rows` one-row windows as its streams draft alike (module docstring).
    Index d of each tuple: every stream that fits carries d drafts (0: none)."""

    round_rows: int
    drafting: tuple[int, ...]  # how many streams carry the d drafts (the row cap may stop some)
    ms: tuple[float, ...]  # the round's verify, overhead and (chained) every chain step
    absorb_cell_ms: float  # each cell a drafting stream's head absorbs past the usual one or two

    @property
    def max_depth(self) -> int:
        return len(self.ms) - 1

    def rate(self, depth: int, gain: float) -> float:
        """Tokens per ms when each drafting stream's d drafts add `gain` expected tokens."""
        ms, expected = self.ms[depth], self.round_rows + self.drafting[depth] * gain
        return expected / ms if ms > 0 else expected


def round_prices(
    costs: CostTable,
    max_depth: int,
    round_rows: int = 1,
    max_rows: int | None = None,
    chained: bool = True,
) -> RoundPrices:
    """Prices of depths 0..max_depth for a round of `round_rows` plain rows (one per decoding
    stream) under the row cap `max_rows` (None: none). `chained` False: drafts that cost no MTP
    chain steps (copy drafts)."""
    base = max(1, round_rows)
    drafting, ms = [], []
    for depth in range(max(0, max_depth) + 1):
        room = base if max_rows is None or depth == 0 else (max_rows - base) // depth
        n = max(0, min(base, room))
        widths = 1 + int(0 < n < base)
        # every chain step is paid, the first too: it is the head's absorb of the kept rows
        chain = costs.chain_ms(depth, n) if chained else 0.0
        drafting.append(n)
        ms.append(costs.shape_ms(base + n * depth, widths) + costs.overhead_ms + chain)
    cell_ms = costs.absorb_cell_ms if chained else 0.0
    return RoundPrices(base, tuple(drafting), tuple(ms), cell_ms)


def choose_depth(
    stats: DraftStats,
    prices: RoundPrices,
    num_rounds: int,
    catch_up_cells: int = 0,
    rounds_left: int | None = None,
    is_refused: bool = False,
    odds: float = 0.5,
) -> int:
    """Depth 0..prices.max_depth for the next chain (the unpriced engine asks for the deepest
    without calling this). `catch_up_cells`: the cells the stream's head would absorb in the
    call past those of a stream that drafted last round; `rounds_left`: the most rounds the
    stream's reply has left (None: no end in sight, PROBE_IDLE_EVERY are counted);
    `is_refused`: the allocator took none of the stream's last drafts (its round was not as
    this rule assumed, and the draft call was paid for nothing), so it drafts again only when
    it probes; `odds`: the chance a catch-up finds good drafts (module docstring)."""
    best = best_depth(stats, prices)
    every = PROBE_EVERY if best else PROBE_IDLE_EVERY
    depth = 0 if is_refused else best
    probe = min(prices.max_depth, best + 1)
    if num_rounds % every == every - 1 and _could_pay(prices, probe):
        depth = probe
    # a stream that drafts pays its head's absorb every round: only an idle or fresh one
    # catches up, and only where drafts that land could repay it
    is_idle = not best or not stats.is_measured(1)
    if depth and catch_up_cells and is_idle:
        rounds = PROBE_IDLE_EVERY if rounds_left is None else rounds_left
        if not _is_worth_catching_up(prices, depth, catch_up_cells, rounds, odds):
            return 0
    return depth


def _could_pay(prices: RoundPrices, depth: int) -> bool:
    """Whether good drafts (PROBE_LANDING) would raise the round's rate at this depth: when
    even they would not (a round already full of rows), a probe measures nothing."""
    return prices.rate(depth, _good_gain(depth)) > prices.rate(0, 0.0)


def _is_worth_catching_up(
    prices: RoundPrices, depth: int, cells: int, rounds: int, odds: float
) -> bool:
    """Whether `odds` of what good drafts at `depth` would save over `rounds` rounds (the
    same tokens in fewer, dearer rounds) repays the heads' catch-up of `cells` cells each and
    the dearer round itself, should the drafts not land (module docstring)."""
    plain_ms, draft_ms = prices.ms[0], prices.ms[depth]
    tokens = prices.round_rows + prices.drafting[depth] * _good_gain(depth)
    saved = rounds * (plain_ms - draft_ms * prices.round_rows / tokens)
    cost = prices.drafting[depth] * cells * prices.absorb_cell_ms + draft_ms - plain_ms
    return odds * saved > cost


def _good_gain(depth: int) -> float:
    return sum(PROBE_LANDING**d for d in range(1, depth + 1))


def best_depth(stats: DraftStats, prices: RoundPrices, max_depth: int | None = None) -> int:
    """The depth up to `max_depth` (None: the prices' deepest) whose drafts raise the whole
    round's tokens per ms the most (module docstring: the round's streams drafting alike)."""
    top = prices.max_depth if max_depth is None else min(max_depth, prices.max_depth)
    best, best_rate = 0, prices.rate(0, 0.0)
    gain, landing = 0.0, 1.0
    for d in range(1, top + 1):
        landing *= stats.rate(d)
        gain += landing
        rate = prices.rate(d, gain)
        if rate > best_rate:
            best, best_rate = d, rate
    return best
