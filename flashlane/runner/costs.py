"""The CostTable, timed at load on the real backend: the target forward at 1..max_rows rows,
one MTP chain step, and the round overhead. Printed at start-up; tests inject their own."""

from __future__ import annotations

import itertools
import time

import torch

from flashlane.drafting.mtp import MtpDrafter
from flashlane.lanes.records import CostTable, Draws
from flashlane.models.flashnext import FlashNext, commit
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams

DENSE_ROWS = 16
# Cells per stream in the timed catch-up draft call (`CostTable.absorb_cell_ms`).
CATCH_UP_CELLS = 32


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _best_ms(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t0) * 1000)
    return best


@torch.no_grad()
def time_costs(
    model: FlashNext, sessions: list[SessionState], max_rows: int, repeats: int = 5
) -> CostTable:
    """Time decode rounds of 1, 2, 3, ... max_rows rows (1, 2, 4, ... past DENSE_ROWS: the
    table interpolates between), the rows spread over as many scratch sessions as there are
    (one row per stream while they last: a shared round's rows cost what its streams cost),
    and what a round pays per distinct window width (`CostTable.group_ms`); the sessions are
    left empty."""
    device = model.embed_tokens.weight.device
    prompt = torch.arange(64, device=device) % model.cfg.vocab_size
    for session in sessions:
        session.reset(model.cfg)
        rows = Rows.of([(session, prompt, 0, False)], device)
        model.residual(rows)
        commit(model, rows.pieces[0], 64)
    # Every count where there are few (the CPU's GEMM speed steps with the rows, more than a
    # line between powers of two says), else powers of two.
    if max_rows <= DENSE_ROWS:
        counts = list(range(1, max_rows + 1))
    else:
        counts = sorted({1, max_rows, *[2**i for i in range(1, 12) if 2**i < max_rows]})
    forwards = {}
    for n in counts:
        streams = min(n, len(sessions))
        forwards[n] = _forward(
            model, sessions, [n // streams + (i < n % streams) for i in range(streams)]
        )
        forwards[n]()
    # Passes over all counts, the best of each kept: a busy stretch of a shared machine then
    # slows one pass, not every repeat of a few neighbouring counts.
    verify_ms = {n: float("inf") for n in counts}
    for _ in range(repeats):
        for n in counts:
            verify_ms[n] = min(verify_ms[n], _best_ms(forwards[n], 1))
    # A forward of more rows never costs less: noise must not make a draft row look free.
    for a, b in itertools.pairwise(counts):
        verify_ms[b] = max(verify_ms[b], verify_ms[a])
    step_ms = stream_ms = cell_ms = 0.0
    if model.mtp is not None:
        step_ms = _step_ms(model, sessions[:1], repeats)
        many = min(4, len(sessions))
        if many > 1:
            stream_ms = max(0.0, _step_ms(model, sessions[:many], repeats) - step_ms) / (many - 1)
        cells = CATCH_UP_CELLS
        cell_ms = max(0.0, _step_ms(model, sessions[:1], repeats, 2 + cells) - step_ms) / cells
    group_ms = _group_ms(model, sessions, max_rows, repeats)
    for session in sessions:
        session.reset(model.cfg)
    return CostTable(
        verify_ms=verify_ms,
        draft_step_ms=step_ms,
        overhead_ms=0.1 * verify_ms[1],
        group_ms=group_ms,
        draft_stream_ms=stream_ms,
        absorb_cell_ms=cell_ms,
    )


def _step_ms(model: FlashNext, sessions: list[SessionState], repeats: int, cells: int = 2) -> float:
    """A depth-1 draft call of the engine's drafter, one stream per session: the head's absorb
    of `cells` kept rows each (two: a stream that drafted last round), then a greedy draft each
    (the sampler and host work included)."""
    device = model.embed_tokens.weight.device
    drafter = MtpDrafter(model, confidence=0.0)
    width = model.cfg.hc_count * model.cfg.hidden_size
    residual = torch.zeros(cells, width, dtype=model.dtype, device=device)
    params = SamplingParams(temperature=0.0)
    start = 64 - cells
    draws = Draws(params, 0, list(range(1, start + 1)), list(range(1, cells + 1)))
    depths = dict.fromkeys(range(len(sessions)), 1)
    by_id = dict(enumerate(sessions))
    tokens = list(range(1, cells + 1))

    def call():
        for i, session in enumerate(sessions):
            session.mtp_length = start
            drafter.absorb_later(i, residual, tokens, cells + 1, draws)
        drafter.draft(depths, by_id)
        _sync(device)

    call()
    return _best_ms(call, repeats)


def _round_ms(model: FlashNext, sessions: list[SessionState], widths: list[int], repeats: int):
    """Best time of a verify round of one window per width (session i holds window i)."""
    forward = _forward(model, sessions, widths)
    forward()
    forward()
    return _best_ms(forward, repeats)


def _forward(model: FlashNext, sessions: list[SessionState], widths: list[int]):
    device = model.embed_tokens.weight.device
    pieces = [
        (sessions[i], torch.arange(w, device=device) % model.cfg.vocab_size, 64, True)
        for i, w in enumerate(widths)
    ]

    def forward():
        r = model.residual(Rows.of(pieces, device))
        model.logits(r)
        _sync(device)

    return forward


def _group_ms(model: FlashNext, sessions: list[SessionState], max_rows: int, repeats: int):
    """What a round pays per distinct window width past the first: windows of 1, 3, 2, 2 rows
    (three stacked calls) against 2, 2, 2, 2 (one), same streams and rows. The median of
    back-to-back pairs: a busy stretch of the machine lands on both sides of a pair."""
    streams = min(4, len(sessions))
    if streams < 2 or max_rows < 2 * streams:
        return 0.0
    even = [2] * streams
    uneven = [1, 3, *even[2:]]
    pair = _forward(model, sessions, even), _forward(model, sessions, uneven)
    for fn in pair:
        fn()
    diffs = sorted(_best_ms(pair[1], 1) - _best_ms(pair[0], 1) for _ in range(2 * repeats + 1))
    return max(0.0, diffs[len(diffs) // 2]) / (len(set(uneven)) - 1)


def describe(costs: CostTable) -> str:
    rows = ", ".join(f"{n}:{ms:.2f}" for n, ms in sorted(costs.verify_ms.items()))
    return (
        f"costs ms: verify rows {{{rows}}}, mtp step {costs.draft_step_ms:.2f}, "
        f"+{costs.draft_stream_ms:.2f} a stream, overhead {costs.overhead_ms:.2f}, "
        f"per window width {costs.group_ms:.2f}, absorb {costs.absorb_cell_ms:.3f} a cell"
    )
