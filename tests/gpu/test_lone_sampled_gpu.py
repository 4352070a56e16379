"""Sampled streams on the lone driver on the GPU: graphed and eager keyed lone steps
(sampling/lone_draw.KeyedDraw: triton_draw's launches inside the step's graph) draw the
tokens one-row shared rounds draw (draw_rows_gpu at the same positions) and leave the
session bit for bit where those rounds leave it; through the engine, sampled replies with
the lone driver equal replies through shared rounds, alone, together and across hand-offs.
top_p streams too: their calls run one step in flight, and a row the kernels leave UNSETTLED
(forced here by flat logits) is settled on the host between graphed steps."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CostTable, Draws
from flashlane.llm import LLM
from flashlane.request import SamplingParams
from flashlane.runner.lone import LoneDriver
from flashlane.sampling.choose import DrawSpec
from flashlane.sampling.gpu import draw_rows_gpu
from flashlane.sampling.lone_draw import KeyedDraw
from tests.gpu.test_exact_gpu import gpu_model, prefilled, prompts, run_windows  # noqa: F401
from tests.gpu.test_lone_gpu import copy_of, lone_model  # noqa: F401
from tests.runner.test_lone import assert_same_states

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.6, top_k=20),
    SamplingParams(temperature=1.4, min_p=0.05),
    SamplingParams(temperature=0.0),  # a greedy stream beside sampled ones
]
TOP_P = [  # one step in flight; rows the kernels cannot call are settled on the host
    SamplingParams(temperature=0.9, top_p=0.8),
    SamplingParams(temperature=0.7, top_k=40, top_p=0.5, min_p=0.02),
    SamplingParams(temperature=1.3, top_p=0.95),
    SamplingParams(temperature=0.0),
]
MIXES = {"settled": PARAMS, "top_p": TOP_P}
PENALIZED = [  # drawn in the step from the reply counts on the device (adjusted_draw.py)
    SamplingParams(temperature=0.0, repetition_penalty=1.5),
    SamplingParams(temperature=0.3, presence_penalty=1.5, frequency_penalty=0.8),
    SamplingParams(temperature=0.0, logit_bias={5: 4.0, 9: -2.0}),
    SamplingParams(temperature=1.2, top_k=300),
]
PENALIZED_TOP_P = [  # the first on the host every step (with the reply so far), beside others
    SamplingParams(temperature=0.8, top_p=0.9, presence_penalty=1.0),
    SamplingParams(temperature=0.5, frequency_penalty=0.4, top_k=30, min_p=0.01),
    SamplingParams(temperature=0.0, logit_bias={7: 3.0}),
    SamplingParams(temperature=1.0),
]
LOGPROBS = [  # the host adds them from the logits the step kept
    SamplingParams(temperature=0.0, logprobs=0),
    SamplingParams(temperature=0.9, logprobs=3),
    SamplingParams(temperature=0.7, top_p=0.9, logprobs=5),
    SamplingParams(temperature=0.0),
]
ENGINE_MIXES = {
    **MIXES,
    "penalized": PENALIZED,
    "penalized_top_p": PENALIZED_TOP_P,
    "logprobs": LOGPROBS,
}


def sampled_rounds(model, ref, params, seed: int, n: int) -> list[int]:
    """n one-row shared rounds from token 3, committed in ref, each drawn as a decode
    window's row 0 is (runner/backend._spec: the position after the fed token)."""
    want = [3]
    for _ in range(n):
        pos = ref.length
        logits = run_windows(model, [(ref, want[-1:])], keep=True)[0]
        want.append(draw_rows_gpu(logits, [DrawSpec(params, seed, pos + 1)])[0])
    return want


def lone_equals_rounds(
    cfg, model, params, seeds, graphed: bool, prompt_ids=(3, 8, 5), idle: int = 0
):
    """Two decode_many calls (8 + 12 steps) of len(params) streams equal one-row shared
    rounds token for token, and the sessions end bit for bit where those rounds leave them.
    idle: sessions the driver holds that no stream uses (3 streams beside 2 idle sessions
    run in the graph of 4 rows: one pad row)."""
    b = len(params)
    bases = [prefilled(cfg, model, prompts(cfg.vocab_size, 9)[w]) for w in prompt_ids[:b]]
    refs = [copy_of(cfg, base) for base in bases]
    wants = [sampled_rounds(model, r, p, s, 20) for r, p, s in zip(refs, params, seeds)]
    sessions = [copy_of(cfg, base) for base in bases]
    driver = LoneDriver(
        model, sessions + [copy_of(cfg, bases[0]) for _ in range(idle)], graphs=graphed
    )
    got = [[3] for _ in range(b)]
    takes = [lambda t, f, i=i: bool(got[i].append(t)) or f for i in range(b)]
    draws = [Draws(p, s, [], []) for p, s in zip(params, seeds)]
    n = driver.decode_many(
        list(range(b)), [3] * b, [s.length for s in sessions], 8, takes, [-1] * b, draws
    )
    n += driver.decode_many(
        list(range(b)),
        [g[-1] for g in got],
        [s.length for s in sessions],
        12,
        takes,
        [-1] * b,
        draws,
    )  # a second call replays the graph
    assert n == 20 and got == wants
    assert len(driver.graphs) == (1 if graphed else 0)
    assert_same_states(sessions, refs)


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("graphed", [True, False])
@pytest.mark.parametrize("b", [1, 3])
def test_keyed_lone_steps_equal_shared_rounds_bitwise(lone_model, graphed, b, mix):  # noqa: F811
    cfg, model = lone_model
    params = MIXES[mix][-b:] if b > 1 else MIXES[mix][:1]
    lone_equals_rounds(cfg, model, params, [11, 2**62 + 3, 5][:b], graphed)


@pytest.mark.parametrize("graphed", [True, False])
def test_unsettled_top_p_rows_are_settled_between_steps(lone_model, graphed, monkeypatch):  # noqa: F811
    """Flat logits: a top_k 128, top_p 0.5 cut's running sum is exactly top_p * S, which the
    kernels never call; such rows are settled on the host from the logits the (graphed) step
    kept, and the next step feeds the token, as shared rounds draw it."""
    cfg, model = lone_model
    head, settle, unsettled = model.head_logits, KeyedDraw.settle, [0]
    monkeypatch.setattr(model, "head_logits", lambda r, xn=None: head(r, xn) * 0)

    def counted(self, rows, tok, pos, slot=None):
        unsettled[0] += sum(r[1] == 0 for r in rows)
        return settle(self, rows, tok, pos, slot)

    monkeypatch.setattr(KeyedDraw, "settle", counted)
    params = [
        SamplingParams(temperature=1.0, top_k=128, top_p=0.5),
        SamplingParams(temperature=0.8, top_p=0.9),
    ]
    lone_equals_rounds(cfg, model, params, [3, 2**61], graphed)
    assert unsettled[0] >= 20  # every step's first row, at least


def reply(o) -> tuple:
    return o.token_ids, o.logprobs


@pytest.mark.parametrize("mix", list(ENGINE_MIXES))
def test_engine_sampled_replies_lone_and_shared_agree(tiny_ckpt, monkeypatch, mix):
    monkeypatch.delenv("FLASHLANE_NO_LONE_SAMPLED", raising=False)  # the default: taken
    costs = CostTable(
        {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2
    )
    llm = LLM(str(tiny_ckpt), costs=costs, parallel=4, max_rows=16, device="cuda", lone_streams=4)
    host = llm.engine.host
    lone = host.lone
    assert lone is not None and lone.use_graphs
    ps = prompts(500, 6)
    params = [
        dataclasses.replace(ENGINE_MIXES[mix][i % 4], max_tokens=m, seed=100 + i, draft=False)
        for i, m in enumerate((40, 9, 33, 1, 25, 60))
    ]
    host.lone = None
    want = [reply(llm.generate(p, q)[0]) for p, q in zip(ps, params)]
    together_want = [reply(o) for o in llm.generate(ps[:4], params[:4])]
    host.lone = lone
    got = [reply(llm.generate(p, q)[0]) for p, q in zip(ps, params)]
    assert got == want and lone.num_steps > 0 and lone.failed is None
    # four together on the lone driver (greedy beside sampled), then hand-offs: every fifth
    # landed step "work arrives"
    assert [reply(o) for o in llm.generate(ps[:4], params[:4])] == together_want
    calls = [0]
    host.interrupted = lambda: calls.__setitem__(0, calls[0] + 1) or calls[0] % 5 == 0
    host.config = dataclasses.replace(host.config, lone_steps=8)
    got = [reply(llm.generate(p, q)[0]) for p, q in zip(ps, params)]
    assert got == want
    assert any(k[0] == "keyed" for k in lone.graphs)


@pytest.mark.parametrize("mix", list(MIXES))
def test_keyed_steps_with_a_pad_row_equal_shared_rounds_bitwise(lone_model, mix):  # noqa: F811
    """Three sampled streams in the step graph of four rows (the fourth decodes the pad
    session): the same tokens and states as one-row shared rounds."""
    cfg, model = lone_model
    lone_equals_rounds(cfg, model, MIXES[mix][:3], [11, 12, 13], True, idle=2)
