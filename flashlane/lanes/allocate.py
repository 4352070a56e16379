"""How many drafts each window carries: draft rows priced by the CostTable (DESIGN.md section 4).

The round's value is its expected new tokens per millisecond. Every window yields one token for
sure (its bonus draw) plus one per forced row; a draft at depth d adds its landing probability
(the product of its chances and those before it). A round is priced by its shape: the verify
forward at its rows, one more stacked call per distinct window width (`CostTable.group_ms`: a
lone draft splits the round's windows in two groups, a draft in every window does not), and
the MTP chain steps past the first that its deepest MTP window needed (the chain runs for all
drafting streams together and is paid every round the streams draft that deep).

The price is not monotone in the rows (the first window of a new width pays for a stacked call,
those that follow it to that width do not), so the allocator compares whole shapes: for each
width, windows widened to it (or to all their drafts, if fewer) one stream at a time, the
likeliest first, and it keeps the best. Equal widths keep the round one stacked call, and
streams that advance together shorten the rounds of the whole batch: a batch waits for its
slowest stream, so the round's drafts count in full only when each of the streams furthest
behind (the round's last, often several tied) drafts too; with none of them drafting they count
at `_ahead_worth`, with some of them in between (`_worth`: one of eight tied streams drafting
alone brings the batch's end an eighth of the way). A stream's first draft is taken while its
acceptance of that kind is unmeasured, so every stream gets measured, where a draft that surely
lands would pay for its row and width (in a round full of rows, none would); after that it is
priced like the rest, so a stream whose drafts do not land drafts nothing.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence

from flashlane.lanes.records import CostTable
from flashlane.lanes.windows import Plan


def allocate(
    plans: Sequence[Plan],
    costs: CostTable | None,
    max_rows: int,
    num_prompt_rows: int = 0,
) -> list[int]:
    """Drafts per plan. `costs` None: the unpriced allocator (most probable drafts first until
    the row cap). `num_prompt_rows` share the forward and its time but not the row cap."""
    counts = [0] * len(plans)
    rows = sum(1 + len(p.forced) for p in plans)
    value = float(rows)  # expected new tokens
    if costs is None:
        return _unpriced(plans, counts, rows, max_rows)
    for i, p in enumerate(plans):
        if p.drafts and rows < max_rows and not p.is_measured:
            # measured only where a draft that surely lands would pay for its row and width
            trial = list(counts)
            trial[i] = 1
            now = value / _Shape(plans, counts, num_prompt_rows).ms(costs)
            if (value + 1.0) / _Shape(plans, trial, num_prompt_rows).ms(costs) > now:
                counts[i], rows, value = 1, rows + 1, value + p.chances[0]
    best, best_rate = counts, value / _Shape(plans, counts, num_prompt_rows).ms(costs)
    progress = [len(p.stream.reply_ids) for p in plans]
    last = min(progress, default=0)
    worth = _ahead_worth(costs, len(plans))
    num_last = progress.count(last)
    for width in range(2, 2 + max((len(p.drafts) for p in plans), default=0)):
        shape = _Shape(plans, counts, num_prompt_rows)
        trial, trial_rows = list(counts), rows
        gains = 0.0
        # the streams furthest behind (often several tied) and how many of them draft
        drafting = sum(1 for n, d in zip(counts, progress) if d == last and n)
        for gain, i in _widenings(plans, counts, width - 1):
            extra = min(width - 1, len(plans[i].drafts)) - trial[i]
            if trial_rows + extra > max_rows:
                break
            drafting += progress[i] == last and not trial[i]
            trial[i] += extra
            trial_rows += extra
            gains += gain
            shape.set_drafts(i, trial[i])
            rate = (value + gains * _worth(worth, drafting, num_last)) / shape.ms(costs)
            if rate > best_rate:
                best, best_rate = list(trial), rate
    return best


def _worth(ahead_worth: float, drafting: int, num_last: int) -> float:
    """What the round's draft tokens are worth (module docstring) while `drafting` of the
    `num_last` streams furthest behind draft: the batch ends when each of those has gained, so
    a tied stream's token brings it 1/num_last of the way; with none drafting, only the rows
    spared after the streams ahead end (`_ahead_worth`)."""
    share = drafting / num_last if num_last else 1.0
    return ahead_worth + (1.0 - ahead_worth) * share


def _ahead_worth(costs: CostTable, num_streams: int) -> float:
    """What a token is worth, relative to the round's average, to a stream while one of the
    round's last drafts nothing: a batch waits for its slowest stream, so such tokens shorten
    no round; they only spare that stream's row in the rounds after it ends."""
    if num_streams < 2:
        return 1.0
    row_ms = (costs.forward_ms(num_streams) - costs.forward_ms(1)) / (num_streams - 1)
    token_ms = (costs.forward_ms(num_streams) + costs.overhead_ms) / num_streams
    return min(1.0, max(0.0, row_ms / token_ms)) if token_ms > 0 else 1.0


def _widenings(plans: Sequence[Plan], counts: list[int], num_drafts: int):
    """(expected extra tokens, plan index) of every window that more drafts would widen, up to
    `num_drafts` drafts each, most valuable first."""
    out = []
    for i, p in enumerate(plans):
        n = min(num_drafts, len(p.drafts))
        if n > counts[i]:
            gain = sum(_landing(p.chances, d) for d in range(counts[i] + 1, n + 1))
            out.append((gain, i))
    out.sort(key=lambda gi: -gi[0])
    return out


def _unpriced(plans: Sequence[Plan], counts: list[int], rows: int, max_rows: int) -> list[int]:
    """Most probable drafts first until the row cap."""
    heap: list[tuple[float, int]] = []
    for i in range(len(plans)):
        _push(heap, plans, counts, i)
    while heap and rows < max_rows:
        _, i = heapq.heappop(heap)
        counts[i], rows = counts[i] + 1, rows + 1
        _push(heap, plans, counts, i)
    return counts


class _Shape:
    """A round's shape as windows widen: its rows, how many windows of each width (prompt
    pieces run apart, as their own calls, and count in rows only), the MTP chain steps past
    the first that its deepest MTP window needed and the MTP windows that chain ran for."""

    __slots__ = ("chained", "plans", "rows", "steps", "widths", "window")

    def __init__(self, plans: Sequence[Plan], counts: list[int], num_prompt_rows: int) -> None:
        self.plans = plans
        self.window = [1 + len(p.forced) + n for p, n in zip(plans, counts)]
        self.widths = Counter(self.window)
        self.rows = sum(self.window) + num_prompt_rows
        self.steps = max(
            (n - 1 for p, n in zip(plans, counts) if p.kind == "mtp" and n > 1), default=0
        )
        self.chained = sum(1 for p, n in zip(plans, counts) if p.kind == "mtp" and n > 0)

    def set_drafts(self, i: int, num_drafts: int) -> None:
        """Window i now carries `num_drafts` drafts (no fewer than before)."""
        old, new = self.window[i], 1 + len(self.plans[i].forced) + num_drafts
        self.widths[old] -= 1
        if not self.widths[old]:
            del self.widths[old]
        self.widths[new] += 1
        self.window[i] = new
        self.rows += new - old
        if self.plans[i].kind == "mtp":
            self.steps = max(self.steps, num_drafts - 1)
            self.chained += old == 1 + len(self.plans[i].forced)

    def ms(self, costs: CostTable) -> float:
        ms = (
            costs.shape_ms(self.rows, len(self.widths))
            + costs.overhead_ms
            + costs.chain_ms(self.steps, self.chained)
        )
        return max(ms, 1e-9)


def _push(heap: list[tuple[float, int]], plans: Sequence[Plan], counts: list[int], i: int) -> None:
    p, n = plans[i], counts[i]
    if n < len(p.drafts):
        heapq.heappush(heap, (-_landing(p.chances, n + 1), i))


def _landing(chances: Sequence[float], depth: int) -> float:
    prob = 1.0
    for c in chances[:depth]:
        prob *= c
    return prob
