"""A new stream's whole short prompt replayed from one CUDA graph per length (runner/
fresh.py) on the GPU, bit for bit against the eager round (DESIGN.md section 1): its rows,
its logits, the state it leaves in the stream's session and the next row after it; the same
graph replayed for other prompts of its length and other sessions; several fresh prompts of
a round replayed one after the other against the eager round of them together. Then an
engine's replies, lone and beside others, with the fresh path on (the default) and off."""

import pytest
import torch

from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.lanes.records import CostTable, Draws, Window
from flashlane.llm import LLM
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from flashlane.runner.fresh import ROWS
from flashlane.runner.graphs import Graphs
from tests.gpu.models import gpu_model_named
from tests.runner.test_fresh import replays_pay
from tests.runner.test_lone import state_of

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=["tiny", "flashnext-4l", "qwen3-next-4l"])
def gpu_model(request, oracle_by_name):
    cfg, model = gpu_model_named(request.param, oracle_by_name)
    model.graphs = Graphs(max_rows=16)  # as an engine of 16 rows a round: wider parts eager
    yield cfg, model
    del model
    torch.cuda.empty_cache()


def _backend(cfg, model, fresh: bool) -> ModelBackend:
    sessions = [
        SessionState.empty(cfg, 512, torch.bfloat16, torch.float32, "cuda") for _ in range(2)
    ]
    b = ModelBackend(model, sessions, max_rows=16, max_prompt_rows=512)
    if fresh:
        assert b.fresh is not None, "a model with graphs replays fresh prompts"
    else:
        b.fresh = None
    return b


def _ids(vocab: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def _round(b: ModelBackend, sid: int, prompt: list[int]) -> tuple:
    """A prompt round, its keep, one decode round: everything a later round reads."""
    w = Window(sid, sid, 0, tuple(prompt), Draws(GREEDY, 0, prompt, []), "prompt", True)
    first = b.verify([w])[0].sampled
    rows = b.fed[sid].residual.clone()
    b.keep({sid: len(prompt)})
    state = [t.clone() for t in state_of(b.sessions[sid])]
    nxt = Window(sid, sid, len(prompt), (first[0],), Draws(GREEDY, 0, prompt, []))
    second = b.verify([nxt])[0].sampled
    after = b.fed[sid].residual.clone()
    b.release(sid)
    return first, rows, state, second, after


@pytest.mark.parametrize("n", [1, 9, 20, ROWS])
def test_a_replayed_fresh_prompt_is_the_eager_round_bit_for_bit(gpu_model, n):
    cfg, model = gpu_model
    eager, fresh = _backend(cfg, model, False), _backend(cfg, model, True)
    for seed, sid in ((1, 0), (2, 1), (3, 0)):  # one graph, other prompts and sessions
        prompt = _ids(cfg.vocab_size, n, seed + 10 * n)
        want, got = _round(eager, sid, prompt), _round(fresh, sid, prompt)
        assert want[0] == got[0] and want[3] == got[3]  # the two rounds' tokens
        assert torch.equal(want[1], got[1]) and torch.equal(want[4], got[4])  # their rows
        assert len(want[2]) == len(got[2])  # the state left in the session
        assert all(torch.equal(x, y) for x, y in zip(want[2], got[2]))
    assert fresh.fresh.failed is None and fresh.fresh.num_runs == 3
    # every length captured at start (`fresh_prompts`), each a graph
    assert sorted(fresh.fresh.entries) == list(range(1, ROWS + 1))
    assert all(e[1] is not None for e in fresh.fresh.entries.values())


def test_fresh_prompts_together_are_the_eager_round_bit_for_bit(gpu_model):
    """Row invariance on the GPU: each prompt's replay alone gives what the eager round of
    all of them together gives its rows, its draw and its session."""
    cfg, model = gpu_model
    prompts = [_ids(cfg.vocab_size, n, 70 + n) for n in (9, 1, 33, ROWS)]
    got = []
    for fresh in (False, True):
        b = _backend(cfg, model, fresh)
        b.sessions += [
            SessionState.empty(cfg, 512, torch.bfloat16, torch.float32, "cuda") for _ in range(2)
        ]
        if fresh:
            replays_pay(b.fresh)
        ws = [
            Window(sid, sid, 0, tuple(p), Draws(GREEDY, 0, p, []), "prompt", True)
            for sid, p in enumerate(prompts)
        ]
        tokens = [v.sampled for v in b.verify(ws)]
        rows = [b.fed[sid].residual.clone() for sid in range(len(prompts))]
        b.keep({sid: len(p) for sid, p in enumerate(prompts)})
        got.append((tokens, rows, [state_of(s) for s in b.sessions]))
        assert not fresh or (b.fresh.num_runs == 1 and b.fresh.failed is None)
    (want_tok, want_rows, want_state), (tok, rows, state) = got
    assert tok == want_tok
    assert all(torch.equal(x, y) for x, y in zip(want_rows, rows))
    for a, b in zip(want_state, state):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def engine_llm():
    cfg, model = build_random(preset("flashnext-4l"), torch.bfloat16, "cuda", seed=3)
    config = EngineConfig.resolve(device="cuda", parallel=4, context=1024, prompt_cache_gb=0)
    costs = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2}, draft_step_ms=0.3, overhead_ms=0.2)
    yield LLM.from_engine(Engine(config, costs=costs, built=(cfg, model)))
    torch.cuda.empty_cache()


def test_replies_with_fresh_prompts_equal_eager_ones(engine_llm):
    llm, b = engine_llm, engine_llm.engine.backend
    assert b.fresh is not None, "an engine with graphs replays fresh prompts by default"
    vocab = llm.engine.model_config.vocab_size
    prompts = [_ids(vocab, n, 500 + n) for n in (3, 9, 17, 40, 64, 65)]
    params = [
        SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=20, temperature=0.8, top_p=0.95, seed=5, ignore_eos=True),
    ]

    def runs() -> list:  # each prompt alone (a fresh prompt's round), then all together
        return [
            [o.token_ids for o in llm.generate(ps, p)]
            for p in params
            for ps in [*([q] for q in prompts), prompts]
        ]

    got = runs()
    assert b.fresh.num_runs >= 10 and b.fresh.failed is None
    priced = b.fresh.replay_ms, b.fresh.eager_ms
    replays_pay(b.fresh)  # the rounds of several prompts replayed too, whatever they cost
    got_too = runs()
    b.fresh.replay_ms, b.fresh.eager_ms = priced
    fresh, b.fresh = b.fresh, None
    try:
        want = runs()
    finally:
        b.fresh = fresh
    assert got == want and got_too == want
