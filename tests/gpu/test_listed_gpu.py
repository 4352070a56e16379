"""The listed decode attention (kernels/attention/triton_listed.py, `--kernels listed`) in the
engine on the GPU, bit for bit: with it on, a row's logits do not depend on its verify
width or on the other streams in the round, and graph replays equal eager rounds. Random
flashnext-4l (real per-layer dimensions) in sessions of up to 4,608 positions, so that rows
list over several ranges and fold in every slice."""

import pytest
import torch

from flashlane.kernels import select_kernels
from flashlane.kernels.attention import triton_listed
from flashlane.models.flashnext import run_piece
from flashlane.models.state import SessionState
from flashlane.runner.backend import copy_session
from flashlane.runner.graphs import Graphs
from tests.gpu.models import gpu_model_named
from tests.gpu.test_exact_gpu import run_windows

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
CAP = 4608
LENGTHS = [3000, 40, 2100, 700, 4000, 2049, 130, 2600]  # prompts: one to two ranges of keys


@pytest.fixture(scope="module")
def listed_model(oracle_by_name):
    cfg, model = gpu_model_named("flashnext-4l", oracle_by_name)
    select_kernels("cuda", decode="listed")  # --kernels listed
    assert triton_listed.LISTED
    yield cfg, model
    select_kernels("cuda")  # the default again
    del model
    torch.cuda.empty_cache()


@pytest.fixture
def listed_calls(monkeypatch):
    """How many times the listed attention ran (eager rounds call it from Python)."""
    calls = []
    inner = triton_listed.attention_listed

    def counted(*args, **kwargs):
        calls.append(1)
        return inner(*args, **kwargs)

    monkeypatch.setattr(triton_listed, "attention_listed", counted)
    return calls


def prefilled(cfg, model, length: int, seed: int) -> SessionState:
    s = SessionState.empty(cfg, CAP, torch.bfloat16, torch.float32, "cuda")
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, cfg.vocab_size, (length,), generator=g).to("cuda")
    for a in range(0, length, 512):
        run_piece(model, s, ids[a : a + 512], a, recurrent=False)
    return s


def copied(cfg, session: SessionState) -> SessionState:
    s = SessionState.empty(cfg, CAP, torch.bfloat16, torch.float32, "cuda")
    copy_session(session, s, cfg.indexer_block)
    return s


@pytest.mark.parametrize("width", [1, 3, 8])
def test_listed_window_rows_equal_serial_rows(listed_model, listed_calls, width):
    cfg, model = listed_model
    base = prefilled(cfg, model, 3000, seed=1)
    s, tokens, want = copied(cfg, base), [3], []
    for _ in range(16):
        want.append(run_windows(model, [(s, tokens[-1:])], keep=True)[0][0])
        tokens.append(int(want[-1].argmax()))
    s, got = copied(cfg, base), []
    while len(got) < 16:
        w = min(width, 16 - len(got))
        got.extend(run_windows(model, [(s, tokens[len(got) : len(got) + w])], keep=True)[0])
    assert listed_calls
    assert torch.equal(torch.stack(got), torch.stack(want))


def test_listed_shared_round_rows_equal_alone(listed_model, listed_calls):
    cfg, model = listed_model
    sessions = [prefilled(cfg, model, n, seed=i) for i, n in enumerate(LENGTHS)]
    g = torch.Generator().manual_seed(5)
    windows = [
        (s, torch.randint(3, cfg.vocab_size, (1 + i % 4,), generator=g).tolist())
        for i, s in enumerate(sessions)
    ]
    together = run_windows(model, windows)
    assert listed_calls
    for (s, t), lg in zip(windows, together):
        assert torch.equal(lg, run_windows(model, [(s, t)])[0])


def test_listed_graph_replays_equal_eager(listed_model):
    cfg, model = listed_model
    sessions = [prefilled(cfg, model, n, seed=9 + i) for i, n in enumerate(LENGTHS[:4])]
    windows = [(s, [5 + i] * w) for i, (s, w) in enumerate(zip(sessions, (1, 2, 3, 4)))]
    try:
        model.graphs = Graphs(max_rows=64)
        graphed = [run_windows(model, windows) for _ in range(2)]  # capture, then replay
        assert model.graphs.failed is None and model.graphs.entries
        model.graphs = None
        eager = run_windows(model, windows)
    finally:
        model.graphs = None
    for g1, g2, e in zip(*graphed, eager):
        assert torch.equal(g1, e) and torch.equal(g2, e)
