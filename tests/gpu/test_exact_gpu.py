"""Exactness on the GPU with the Triton kernels, logits compared bit for bit (DESIGN.md
section 1): a row's logits do not depend on the verify width, on the other streams in the
round, or on whether its tokens came as drafts. Tiny oracle checkpoints (Flash Next's and
each sibling's) and random flashnext-4l and qwen3-next-4l (real per-layer dimensions), bf16
weights, fp32 GDN state; the random ones replay their blocks' parts from CUDA graphs."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.models.flashnext import commit, run_piece
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import copy_session
from flashlane.runner.graphs import Graphs
from tests.gpu.models import gpu_model_named
from tests.oracle import GATE_CHECKPOINTS, SIBLINGS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
CAP = 512


@pytest.fixture(scope="module", params=["tiny", "flashnext-4l", *sorted(SIBLINGS), "qwen3-next-4l"])
def gpu_model(request, oracle_by_name):
    cfg, model = gpu_model_named(request.param, oracle_by_name)
    if request.param.endswith("-4l"):  # the tiny models run eagerly, these with graphs
        model.graphs = Graphs(max_rows=64)
    yield cfg, model
    del model
    torch.cuda.empty_cache()


def new_session(cfg):
    return SessionState.empty(cfg, CAP, torch.bfloat16, torch.float32, "cuda")


def prefilled(cfg, model, prompt):
    s = new_session(cfg)
    ids = torch.tensor(prompt, device="cuda")
    for a in range(0, len(prompt), 64):
        run_piece(model, s, ids[a : a + 64], a, recurrent=False)
    return s


def run_windows(model, windows, keep=None):
    """One forward over [(session, tokens)] verify windows: logits per window. With `keep`,
    each window's rows are committed (kept whole); without, nothing is."""
    rows = Rows.of(
        [(s, torch.tensor(t, device="cuda"), s.length, True) for s, t in windows], "cuda"
    )
    logits = model.logits(model.residual(rows))
    if keep:
        for p in rows.pieces:
            commit(model, p, p.length)
    return [logits[p.rows] for p in rows.pieces]


def prompts(vocab, n):
    g = torch.Generator().manual_seed(7)
    lens = [5, 70, 17, 130, 9, 64, 33, 3, 200, 41, 66, 12, 90, 1, 127, 150]
    return [torch.randint(3, vocab, (lens[i],), generator=g).tolist() for i in range(n)]


def greedy_serial(cfg, model, session, n):
    """Greedy one-row decoding from a prefilled session: (tokens fed, logits per step)."""
    s = new_session(cfg)
    copy_session(session, s, cfg.indexer_block)
    tok, logs = [3], []
    for _ in range(n):
        lg = run_windows(model, [(s, tok[-1:])], keep=True)[0][0]
        logs.append(lg)
        tok.append(int(lg.argmax()))
    return tok[:n], torch.stack(logs)


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 13, 16])
def test_window_rows_equal_serial_rows_bitwise(gpu_model, width):
    cfg, model = gpu_model
    base = prefilled(cfg, model, prompts(cfg.vocab_size, 3)[2])
    tokens, want = greedy_serial(cfg, model, base, 16)
    s = new_session(cfg)
    copy_session(base, s, cfg.indexer_block)
    got = []
    while len(got) < 16:
        w = min(width, 16 - len(got))
        got.extend(run_windows(model, [(s, tokens[len(got) : len(got) + w])], keep=True)[0])
    assert torch.equal(torch.stack(got), want)


@pytest.mark.parametrize("streams", [2, 4, 8, 16])
def test_shared_round_rows_equal_alone_bitwise(gpu_model, streams):
    cfg, model = gpu_model
    sessions = [prefilled(cfg, model, p) for p in prompts(cfg.vocab_size, streams)]
    g = torch.Generator().manual_seed(streams)
    windows = [
        (s, torch.randint(3, cfg.vocab_size, (1 + i % 4,), generator=g).tolist())
        for i, s in enumerate(sessions)
    ]
    together = run_windows(model, windows)
    for (s, t), lg in zip(windows, together):
        alone = run_windows(model, [(s, t)])[0]
        assert torch.equal(lg, alone)


@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
def test_llm_replies_drafted_shared_and_alone_agree(oracle_by_name, name):
    costs = CostTable(
        {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2
    )
    llm = LLM(str(oracle_by_name(name)), costs=costs, parallel=8, max_rows=16, device="cuda")
    assert llm.engine.kernels.name == "triton"
    ps = prompts(500, 8)
    for params in (
        SamplingParams(max_tokens=24, temperature=0.0),
        SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=11),
    ):
        plist = [dataclasses.replace(params, draft=(i % 3 != 1)) for i in range(len(ps))]
        together = llm.generate(ps, plist)
        for prompt, p, got in zip(ps, plist, together):
            alone = llm.generate(prompt, dataclasses.replace(p, draft=False))[0]
            assert got.error is None
            assert got.token_ids == alone.token_ids


@pytest.mark.parametrize("widths", [(1, 2, 3, 4), (1,), (1, 1, 1), (3, 3, 3, 3)])
def test_graph_replays_equal_eager_bitwise(gpu_model, widths):
    """Windows of mixed widths take the read/mix/mlp parts; windows of one width also replay
    the PLE and the GDN conv on [B, T] inputs."""
    cfg, model = gpu_model
    sessions = [prefilled(cfg, model, p) for p in prompts(cfg.vocab_size, len(widths))]
    windows = [(s, [5 + i] * w) for i, (s, w) in enumerate(zip(sessions, widths))]
    saved = model.graphs
    try:
        model.graphs = Graphs(max_rows=64)
        graphed = [run_windows(model, windows) for _ in range(2)]  # capture, then replay
        assert model.graphs.failed is None and model.graphs.entries
        model.graphs = None
        eager = run_windows(model, windows)
    finally:
        model.graphs = saved
    for g1, g2, e in zip(*graphed, eager):
        assert torch.equal(g1, e) and torch.equal(g2, e)


def test_graphed_decode_rounds_keep_what_eager_rounds_keep(gpu_model):
    """Three committed rounds of one-row windows for three streams, graphed and eager from
    copies of the same sessions: every round's logits bit for bit."""
    cfg, model = gpu_model
    base = [prefilled(cfg, model, p) for p in prompts(cfg.vocab_size, 3)]
    runs = []
    saved = model.graphs
    try:
        for graphs in (Graphs(max_rows=64), None):
            model.graphs = graphs
            sessions = [new_session(cfg) for _ in base]
            for b, s in zip(base, sessions):
                copy_session(b, s, cfg.indexer_block)
            runs.append(
                [
                    run_windows(
                        model, [(s, [7 + i + 3 * r]) for i, s in enumerate(sessions)], keep=True
                    )
                    for r in range(3)
                ]
            )
    finally:
        model.graphs = saved
    for got, want in zip(*runs):
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_every_bucket_captures_at_start(gpu_model):
    from flashlane.runner.graphs import capture_all

    _, model = gpu_model
    graphs = Graphs(max_rows=64)
    secs, used = capture_all(model, graphs)
    assert graphs.failed is None
    mtp = list(model.mtp.layers) if model.mtp is not None else []
    parts = sum(
        (3 if layer.kind == "linear" else 2) + (layer.ple is not None)
        for layer in [*model.layers, *mtp]
    )
    assert len(graphs.entries) == parts * len(graphs.sizes)
    assert secs > 0 and used >= 0
