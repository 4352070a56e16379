"""How many drafts each window carries: draft rows priced by the CostTable (DESIGN.md section 4).

The round's value is its expected new tokens per millisecond. Every window yields one token for
sure (its bonus draw) plus one per forced row; a draft at depth d adds its landing probability
(the product of its chances and those before it). Its price is the verify forward's growth by a
row, plus an MTP chain step for each MTP draft past a stream's first (the chain that made it is
paid every round the stream drafts that deep). Rows are added from a heap, most probable first,
while the ratio rises. A stream's first draft is taken while its acceptance of that kind is
unmeasured, so every stream gets measured; after that it is priced like the rest, so a stream
whose drafts do not land drafts nothing.
"""

from __future__ import annotations

import heapq
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
    # (-landing probability, plan index) of each plan's next draft
    heap: list[tuple[float, int]] = []
    for i, p in enumerate(plans):
        if p.drafts and rows < max_rows and costs is not None and not p.is_measured:
            counts[i], rows, value = 1, rows + 1, value + p.chances[0]
        _push(heap, plans, counts, i)
    steps = 0  # MTP chain steps past each stream's first draft
    while heap and rows < max_rows:
        neg_prob, i = heapq.heappop(heap)
        step = int(plans[i].kind == "mtp" and counts[i] > 0)
        if costs is not None:
            now = value / _round_ms(costs, rows + num_prompt_rows, steps)
            after = (value - neg_prob) / _round_ms(costs, rows + 1 + num_prompt_rows, steps + step)
            if after <= now:
                # Its deeper drafts are no likelier and no cheaper: drop this plan's tail.
                continue
        counts[i] += 1
        rows, value, steps = rows + 1, value - neg_prob, steps + step
        _push(heap, plans, counts, i)
    return counts


def _push(heap: list[tuple[float, int]], plans: Sequence[Plan], counts: list[int], i: int) -> None:
    p, n = plans[i], counts[i]
    if n < len(p.drafts):
        heapq.heappush(heap, (-_landing(p.chances, n + 1), i))


def _landing(chances: Sequence[float], depth: int) -> float:
    prob = 1.0
    for c in chances[:depth]:
        prob *= c
    return prob


def _round_ms(costs: CostTable, num_rows: int, chain_steps: int) -> float:
    ms = costs.forward_ms(num_rows) + costs.overhead_ms + costs.draft_step_ms * chain_steps
    return max(ms, 1e-9)
