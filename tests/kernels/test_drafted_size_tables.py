"""Drafted lone steps through size tables (runner/lone_draft.py): the Triton kernels name
each session from the anchor's buffers, a window's rows get their session's table row once
each, rows past the streams are the pad session's. The same steps eagerly with the reference
kernels (sessions stacked, no tables) are the oracle: the same tokens, lengths and states.

Cases: one session (its window table is one row repeated: a view of stride 0 once reached
the kernels, which read rows TABLE_WIDTH apart, and wrote through a stray table on the
H200), and three in a graph of four rows whose anchor is the pad (sessions smaller than a
drafted call's reach)."""

from __future__ import annotations

import pytest
import torch

from flashlane.drafting.mtp import MtpDrafter
from flashlane.kernels import REFERENCE
from flashlane.lanes.records import Draws, Window
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.runner.backend import ModelBackend
from flashlane.runner.lone import LoneDriver
from flashlane.runner.lone_buffers import SizeTables
from tests.kernels.triton_env import DEVICE, DOT_TOL, needs_triton
from tests.runner.test_lone import GREEDY, state_of

pytest.importorskip("triton")

pytestmark = needs_triton

PROMPTS = [[3, 5, 7, 9, 11, 13], [4, 6, 8, 10], [1, 2, 3]]
CAPACITY = 64  # below the pad's (a call's reach from position 0): the pad is the anchor


def prefilled(model, cfg, prompt):
    s = SessionState.empty(cfg, CAPACITY, torch.float32, torch.float32, DEVICE)
    backend = ModelBackend(model, [s], max_rows=16)
    v = backend.verify(
        [Window(0, 0, 0, tuple(prompt), Draws(GREEDY, 0, prompt, []), "prompt", True)]
    )
    backend.keep({0: len(prompt)})
    return s, v[0].sampled[0]


def drafted(model, cfg, b: int, tables: bool):
    """One drafted step of b sessions; tables: through size tables (sizes 1, 2, 4)."""
    pairs = [prefilled(model, cfg, p) for p in PROMPTS[:b]]
    sessions = [s for s, _ in pairs]
    driver = LoneDriver(model, sessions, graphs=False, drafter=MtpDrafter(model, 0.0))
    if tables:  # the graphed steps' tables, run eagerly (the interpreter has no graphs)
        driver.size_tables = SizeTables(cfg, sessions, driver.max_steps * 3, driver.device)
        driver.sizes, driver.use_graphs = [1, 2, 4], True
        driver.runner = lambda ids, io: lambda: driver._step(ids, io)
        assert driver.size_tables.anchor is driver.size_tables.pad
    got = [[int(first)] for _, first in pairs]
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
    return got, sessions


@pytest.mark.parametrize("b", [1, 3])
def test_drafted_steps_through_size_tables(tiny_ckpt, b):
    from flashlane.kernels.gpu import TRITON

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float32)
    model.to(DEVICE)
    want, refs = drafted(model, cfg, b, tables=False)
    model.use_kernels(TRITON)
    try:
        got, sessions = drafted(model, cfg, b, tables=True)
    finally:
        model.use_kernels(REFERENCE)
    assert got == want
    for s, ref in zip(sessions, refs):
        assert s.length == ref.length
        for x, y in zip(state_of(s), state_of(ref)):
            scale = max(y.abs().max().item(), 1.0)
            assert (x - y).abs().max().item() <= DOT_TOL * scale
