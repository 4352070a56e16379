"""The CostTable, timed at load on the real backend: the target forward at 1..max_rows rows,
one MTP chain step, and the round overhead. Printed at start-up; tests inject their own."""

from __future__ import annotations

import itertools
import time

import torch

from flashlane.lanes.records import CostTable
from flashlane.models.flashnext import FlashNext, commit
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState


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
    """Time decode rounds of 1, 2, 4, ... max_rows rows (the table interpolates between), the
    rows spread over as many scratch sessions as there are (one row per stream while they
    last: a shared round's rows cost what its streams cost); the sessions are left empty."""
    device = model.embed_tokens.weight.device
    prompt = torch.arange(64, device=device) % model.cfg.vocab_size
    for session in sessions:
        session.reset(model.cfg)
        rows = Rows.of([(session, prompt, 0, False)], device)
        model.residual(rows)
        commit(model, rows.pieces[0], 64)
    session = sessions[0]
    counts = sorted({1, max_rows, *[2**i for i in range(1, 12) if 2**i < max_rows]})
    verify_ms = {}
    for n in counts:
        streams = min(n, len(sessions))
        widths = [n // streams + (i < n % streams) for i in range(streams)]
        pieces = [(sessions[i], torch.arange(w, device=device) % model.cfg.vocab_size, 64, True)
                  for i, w in enumerate(widths)]

        def forward(pieces=pieces):
            r = model.residual(Rows.of(pieces, device))
            model.logits(r)
            _sync(device)

        forward()
        forward()
        verify_ms[n] = _best_ms(forward, repeats)
    # A forward of more rows never costs less: noise must not make a draft row look free.
    for a, b in itertools.pairwise(counts):
        verify_ms[b] = max(verify_ms[b], verify_ms[a])
    step_ms = 0.0
    if model.mtp is not None:
        res = torch.zeros(
            1, model.cfg.hc_count * model.cfg.hidden_size, dtype=model.dtype, device=device
        )

        def step():
            cells = Rows.of([(session, torch.tensor([1]), 64, False)], device)
            model.mtp_cells(res, cells.token_ids, cells)
            _sync(device)

        step()
        step_ms = _best_ms(step, repeats)
    for session in sessions:
        session.reset(model.cfg)
    return CostTable(verify_ms=verify_ms, draft_step_ms=step_ms, overhead_ms=0.1 * verify_ms[1])


def describe(costs: CostTable) -> str:
    rows = ", ".join(f"{n}:{ms:.2f}" for n, ms in sorted(costs.verify_ms.items()))
    return (
        f"costs ms: verify rows {{{rows}}}, mtp step {costs.draft_step_ms:.2f}, "
        f"overhead {costs.overhead_ms:.2f}"
    )
