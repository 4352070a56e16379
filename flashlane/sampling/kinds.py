"""Which rows the fused keyed draw (triton_draw) takes, without importing Triton.

fused_draw asks this when it writes a call's parameter table, and the lone driver's keyed draw
(sampling/lone_draw.py) when it loads its streams: a row the kernels settle needs no host; the
rest (a top_p cut they cannot prove, and OTHER rows: logit_bias, penalties, top_k past
MAX_TOP_K) are drawn on the host between steps, so a lone call with such a row runs one step in
flight (`is_always_settled`).
"""

from __future__ import annotations

from flashlane.request import SamplingParams
from flashlane.sampling.spec import GREEDY_TEMPERATURE

# Row kinds in the kernels' parameter table (kernels/sampling/triton_keyed names the same numbers).
OTHER, GREEDY, PLAIN, TOP_K, TOP_P = 0, 1, 2, 3, 4
MAX_TOP_K = 128  # larger top_k rows take the torch path


def row_kind(params: SamplingParams, vocab: int | None = None) -> int:
    """The kernels' kind of a row drawn with `params`: OTHER (the torch path) for logit_bias
    or a penalty, or a top_k above MAX_TOP_K. A top_k of `vocab` or more keeps every id (a
    plain row); without `vocab` such a top_k counts as a top_k."""
    p = params
    if p.logit_bias or p.repetition_penalty != 1.0:
        return OTHER
    if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
        return OTHER
    if p.temperature < GREEDY_TEMPERATURE:
        return GREEDY
    top_k = p.top_k if vocab is None or p.top_k < vocab else 0
    if top_k > 0:
        return TOP_K if top_k <= MAX_TOP_K else OTHER
    return PLAIN if p.top_p >= 1.0 else TOP_P


def is_always_settled(params: SamplingParams, vocab: int | None = None) -> bool:
    """Whether the kernels settle every row drawn with `params`, so a device step needs no
    host: greedy, plain and min_p rows, and top_k rows without top_p. (A top_p cut is taken
    only when an error bound proves it; the rest come back UNSETTLED.)"""
    kind = row_kind(params, vocab)
    return kind in (GREEDY, PLAIN) or (kind == TOP_K and params.top_p >= 1.0)
