"""The depth rule: how many MTP drafts a stream asks of its next chain.

The depth whose drafts raise the next round's expected tokens per millisecond the most, from
the stream's measured acceptance per depth (a half while unmeasured, so a fresh stream reaches
for depth). The round is priced by its shape, as `allocate` prices it, on the assumption that
the round's other streams draft like this one: each of the `round_rows` streams carries d drafts
while the row cap leaves room (then the windows are of one width and stay one stacked call),
the rest none (one width more). All d chain steps are paid (the first is the head's absorb of
the kept rows; `allocate` prices only steps past the first, the drafts being made by then).
Every PROBE_EVERY rounds (PROBE_IDLE_EVERY for a stream that drafts nothing) it asks one deeper
than the best, so the rate one past it is measured again: acceptance drifts with the text.
Depth 0 means no draft call this round; the probe still asks for one, unless even drafts that
land as often as good drafts do (PROBE_LANDING at each depth) would not pay for their round:
then a probe measures nothing worth knowing. A stream that drafted nothing for a while makes
its head absorb every cell kept since (`catch_up_cells`) in its probe's call; that catch-up is
charged to the rounds the probe's drafts would have to repay it in: the PROBE_EVERY rounds to a
drafting stream's next probe, or the rounds its reply has left if fewer.
"""

from __future__ import annotations

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


def choose_depth(
    stats: DraftStats,
    costs: CostTable | None,
    max_depth: int,
    num_rounds: int,
    round_rows: int = 1,
    max_rows: int | None = None,
    catch_up_cells: int = 0,
    rounds_left: int | None = None,
    is_refused: bool = False,
) -> int:
    """Depth 0..max_depth for the next chain; `costs` None (unpriced): always `max_depth`.
    `round_rows`: the plain rows the next round carries anyway (one per decoding stream);
    `max_rows`: the round's row cap (None: no cap); `catch_up_cells`: the cells the stream's
    head would absorb in the call past those of a stream that drafted last round;
    `rounds_left`: the most rounds the stream's reply has left (None: no end in sight);
    `is_refused`: the allocator took none of the stream's last drafts (its round was not as
    this rule assumed, and the draft call was paid for nothing), so it drafts again only when
    it probes."""
    if costs is None or max_depth <= 0:
        return max(0, max_depth)
    best = best_depth(stats, costs, max_depth, round_rows, max_rows)
    every = PROBE_EVERY if best else PROBE_IDLE_EVERY
    # a stream that drafts pays its head's absorb every round: only an idle one catches up
    horizon = PROBE_EVERY if rounds_left is None else max(1, min(PROBE_EVERY, rounds_left))
    cells = 0.0 if best else catch_up_cells / horizon
    if num_rounds % every == every - 1 and _could_pay(
        best + 1, costs, round_rows, max_rows, cells
    ):
        return min(max_depth, best + 1)
    return 0 if is_refused else best


def _could_pay(
    depth: int, costs: CostTable, round_rows: int, max_rows: int | None, cells: float = 0.0
) -> bool:
    """Whether good drafts (PROBE_LANDING) would raise the round's rate at this depth, each of
    the round's drafting streams (alike) absorbing `cells` more cells a round: when even they
    would not (a round already full of rows), a probe measures nothing and is not made."""
    gain = sum(PROBE_LANDING**d for d in range(1, depth + 1))
    return _rate(round_rows, depth, gain, costs, max_rows, cells=cells) > _rate(
        round_rows, 0, 0.0, costs, max_rows
    )


def best_depth(
    stats: DraftStats,
    costs: CostTable,
    max_depth: int,
    round_rows: int = 1,
    max_rows: int | None = None,
    chained: bool = True,
) -> int:
    """The depth whose drafts raise the whole round's tokens per ms the most (module
    docstring: the round's streams drafting alike, priced by its shape). `chained` False:
    drafts that cost no MTP chain steps (copy drafts)."""
    best, best_rate = 0, _rate(round_rows, 0, 0.0, costs, max_rows)
    gain, landing = 0.0, 1.0
    for d in range(1, max_depth + 1):
        landing *= stats.rate(d)
        gain += landing
        rate = _rate(round_rows, d, gain, costs, max_rows, chained)
        if rate > best_rate:
            best, best_rate = d, rate
    return best


def _rate(
    round_rows: int,
    depth: int,
    gain: float,
    costs: CostTable,
    max_rows: int | None,
    chained: bool = True,
    cells: float = 0.0,
) -> float:
    """Tokens per ms of a round of `round_rows` one-row windows, as many of which as fit
    carry `depth` drafts that each add `gain` expected tokens (their heads first absorbing
    `cells` cells each past the usual)."""
    base = max(1, round_rows)
    room = base if max_rows is None or depth == 0 else (max_rows - base) // depth
    drafting = max(0, min(base, room))
    widths = 1 + int(0 < drafting < base)
    # every chain step is paid, the first too: it is the head's absorb of the kept rows
    ms = (
        costs.shape_ms(base + drafting * depth, widths)
        + costs.overhead_ms
        + (costs.chain_ms(depth, drafting) if chained else 0.0)
        + (drafting * cells * costs.absorb_cell_ms if chained and depth else 0.0)
    )
    expected = base + drafting * gain
    return expected / ms if ms > 0 else expected
