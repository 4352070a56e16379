"""Sampled streams on the lone driver on the GPU: graphed and eager keyed lone steps
(sampling/lone_draw.KeyedDraw: triton_draw's launches inside the step's graph) draw the
tokens one-row shared rounds draw (draw_rows_gpu at the same positions) and leave the
session bit for bit where those rounds leave it; through the engine, sampled replies with
the lone driver equal replies through shared rounds, alone, together and across hand-offs."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CostTable, Draws
from flashlane.llm import LLM
from flashlane.request import SamplingParams
from flashlane.runner.lone import LoneDriver
from flashlane.sampling.choose import DrawSpec
from flashlane.sampling.gpu import draw_rows_gpu
from tests.gpu.test_exact_gpu import gpu_model, prefilled, prompts, run_windows  # noqa: F401
from tests.gpu.test_lone_gpu import copy_of
from tests.runner.test_lone import state_of

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


def sampled_rounds(model, ref, params, seed: int, n: int) -> list[int]:
    """n one-row shared rounds from token 3, committed in ref, each drawn as a decode
    window's row 0 is (runner/backend._spec: the position after the fed token)."""
    want = [3]
    for _ in range(n):
        pos = ref.length
        logits = run_windows(model, [(ref, want[-1:])], keep=True)[0]
        want.append(draw_rows_gpu(logits, [DrawSpec(params, seed, pos + 1)])[0])
    return want


@pytest.mark.parametrize("graphed", [True, False])
@pytest.mark.parametrize("b", [1, 3])
def test_keyed_lone_steps_equal_shared_rounds_bitwise(gpu_model, graphed, b):  # noqa: F811
    cfg, model = gpu_model
    bases = [prefilled(cfg, model, prompts(cfg.vocab_size, 9)[w]) for w in (3, 8, 5)[:b]]
    params, seeds = PARAMS[-b:] if b > 1 else PARAMS[:1], [11, 2**62 + 3, 5][:b]
    refs = [copy_of(cfg, base) for base in bases]
    wants = [sampled_rounds(model, r, p, s, 20) for r, p, s in zip(refs, params, seeds)]
    sessions = [copy_of(cfg, base) for base in bases]
    driver = LoneDriver(model, sessions, graphs=graphed)
    got = [[3] for _ in range(b)]
    takes = [lambda t, f, i=i: bool(got[i].append(t)) or f for i in range(b)]
    draws = [Draws(p, s, [], []) for p, s in zip(params, seeds)]
    n = driver.decode_many(list(range(b)), [3] * b, [s.length for s in sessions], 8, takes,
                           [-1] * b, draws)
    n += driver.decode_many(list(range(b)), [g[-1] for g in got], [s.length for s in sessions],
                            12, takes, [-1] * b, draws)  # a second call replays the graph
    assert n == 20 and got == wants
    assert len(driver.graphs) == (1 if graphed else 0)
    for s, ref in zip(sessions, refs):
        assert s.length == ref.length
        for x, y in zip(state_of(s), state_of(ref)):
            assert torch.equal(x, y)


def test_engine_sampled_replies_lone_and_shared_agree(tiny_ckpt, monkeypatch):
    monkeypatch.setenv("FLASHLANE_LONE_SAMPLED", "1")  # off on CUDA by default until this passes
    costs = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3,
                      overhead_ms=0.2)
    llm = LLM(str(tiny_ckpt), costs=costs, parallel=4, max_rows=16, device="cuda",
              lone_streams=4)
    host = llm.engine.host
    lone = host.lone
    assert lone is not None and lone.use_graphs
    ps = prompts(500, 6)
    params = [dataclasses.replace(PARAMS[i % 4], max_tokens=m, seed=100 + i, draft=False)
              for i, m in enumerate((40, 9, 33, 1, 25, 60))]
    host.lone = None
    want = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    together_want = [o.token_ids for o in llm.generate(ps[:4], params[:4])]
    host.lone = lone
    got = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    assert got == want and lone.num_steps > 0 and lone.failed is None
    # four together on the lone driver (greedy beside sampled), then hand-offs: every fifth
    # landed step "work arrives"
    assert [o.token_ids for o in llm.generate(ps[:4], params[:4])] == together_want
    calls = [0]
    host.interrupted = lambda: (calls.__setitem__(0, calls[0] + 1) or calls[0] % 5 == 0)
    host.config = dataclasses.replace(host.config, lone_steps=8)
    got = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    assert got == want
    assert any(k[0] == "keyed" for k in lone.graphs)
