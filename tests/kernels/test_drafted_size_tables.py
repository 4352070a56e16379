"""Drafted lone steps through size tables (runner/lone_draft.py): the Triton kernels name
each session from the anchor's buffers, a window's rows get their session's table row once
each, rows past the streams are the pad session's. The same steps eagerly with the reference
kernels (sessions stacked, no tables) are the oracle: the same tokens, lengths and states.

Cases: one session at depth 3 (its window table is one row repeated: a view of stride 0
once reached the kernels, which read rows TABLE_WIDTH apart, and wrote through a stray table
on the H200), and three at depth 2 in a graph of four rows whose anchor is the pad (sessions
smaller than a drafted call's reach). The MTP chain's drafts for the next step are the
reference's too."""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels import REFERENCE
from flashlane.lanes.records import Draws, Window
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.runner.backend import ModelBackend
from flashlane.runner.lone import LoneDriver
from flashlane.runner.lone_buffers import SizeTables
from tests.kernels.triton_env import DEVICE, DOT_TOL, needs_triton
from tests.runner.test_lone import state_of
from tests.runner.test_lone_draft import DRAFTING

pytest.importorskip("triton")

pytestmark = needs_triton

PROMPTS = [[3, 5, 7, 9, 11, 13], [4, 6, 8, 10], [1, 2, 3]]
CAPACITY = 64  # below the pad's (a call's reach from position 0): the pad is the anchor


def prefilled(model, cfg, prompts):
    """Sessions of the prompts (stream and session i: prompt i) -> (sessions, the first
    draws, the drafter whose MTP head absorbed the prompts: its cells wait for the lone
    driver, so no cache row a draft reads is left unwritten)."""
    sessions = [
        SessionState.empty(cfg, CAPACITY, torch.float32, torch.float32, DEVICE) for _ in prompts
    ]
    backend = ModelBackend(model, sessions, max_rows=16, mtp_confidence=0.0)
    windows = [
        Window(i, i, 0, tuple(p), Draws(DRAFTING, 0, p, []), "prompt", True)
        for i, p in enumerate(prompts)
    ]
    verdicts = backend.verify(windows)
    backend.keep({i: len(p) for i, p in enumerate(prompts)})
    return sessions, [v.sampled[0] for v in verdicts], backend.drafter


def drafted(model, cfg, b: int, tables: bool, depth: int, kernels=REFERENCE):
    """One drafted step of b sessions at `depth` with `kernels`, after a prefill with the
    reference kernels (on a GPU fla's chunked GDN, tf32 dots, would prefill otherwise: its
    states differ from the reference's by 1e-4..1e-2, the step's own error hidden under them);
    tables: through size tables (sizes 1, 2, 4) -> (the tokens, the sessions, the next step's
    drafts the chain made on the device)."""
    sessions, firsts, drafter = prefilled(model, cfg, PROMPTS[:b])
    model.use_kernels(kernels)
    driver = LoneDriver(model, sessions, graphs=False, drafter=drafter)
    driver.drafting.depth = depth
    if tables:  # the graphed steps' tables, run eagerly (the interpreter has no graphs)
        driver.size_tables = SizeTables(cfg, sessions, driver.max_steps * 3, driver.device)
        driver.sizes, driver.use_graphs = [1, 2, 4], True
        driver.runner = lambda ids, io: lambda: driver._step(ids, io)
        assert driver.size_tables.anchor is driver.size_tables.pad
    got = [[int(first)] for first in firsts]
    takes = [lambda t, f, i=i: bool(got[i].append(t)) or True for i in range(b)]
    n = driver.drafting.decode(
        list(range(b)),
        [g[-1] for g in got],
        [s.length for s in sessions],
        1,
        400,
        takes,
        list(range(b)),
        [None] * b,
    )
    assert n == 1
    carry = driver.drafting.carry
    return got, sessions, [carry[i][1].drafts[carry[i][2]].tolist() for i in range(b)]


# one session at depth 3 (the chain's cells d = 0, 1 after the window's), three at depth 2
@pytest.mark.parametrize("b,depth", [(1, 3), (3, 2)])
def test_drafted_steps_through_size_tables(tiny_ckpt, b, depth):
    from flashlane.kernels.gpu import TRITON

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float32)
    model.to(DEVICE)
    want, refs, want_drafts = drafted(model, cfg, b, False, depth)
    try:
        got, sessions, drafts = drafted(model, cfg, b, True, depth, TRITON)
    finally:
        model.use_kernels(REFERENCE)
    assert got == want
    # the MTP chain's drafts for the next step: the reference's, `depth` of them
    assert drafts == want_drafts and all(len(d) == depth for d in drafts)
    for s, ref in zip(sessions, refs):
        assert s.length == ref.length
        for x, y in zip(state_of(s), state_of(ref)):
            scale = max(y.abs().max().item(), 1.0)
            assert (x - y).abs().max().item() <= DOT_TOL * scale
