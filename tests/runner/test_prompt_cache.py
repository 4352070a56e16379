"""Prompt cache on the real backend: a resumed reply equals its fresh run (tokens and the
logits behind them), drafted or not, greedy or seeded, for Flash Next and each sibling;
every session comes back free."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CostTable, Draws, Window
from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from tests.oracle import GATE_CHECKPOINTS

COSTS = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, logprobs=2)
SEEDED = SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=11, logprobs=2)
PARAMS = [
    pytest.param(dataclasses.replace(p, draft=d), id=f"{name}-{'draft' if d else 'nodraft'}")
    for name, p in [("greedy", GREEDY), ("seeded", SEEDED)]
    for d in (True, False)
]


@pytest.fixture(scope="module")
def fresh_of(oracle_by_name):
    """name -> the reference engine of that checkpoint: no prompt cache, no drafts."""
    made = {}

    def get(name: str) -> LLM:
        if name not in made:
            made[name] = LLM(
                str(oracle_by_name(name)), costs=COSTS, parallel=1, max_rows=16, prompt_cache_gb=0
            )
        return made[name]

    return get


@pytest.fixture(scope="module")
def fresh(fresh_of):
    return fresh_of("tiny")


@pytest.fixture
def cached(tiny_ckpt):
    return LLM(str(tiny_ckpt), costs=COSTS, parallel=2, max_rows=16)


def ids(n, seed):
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def same(got, want):
    assert got.error is None and want.error is None
    assert got.token_ids == want.token_ids
    assert got.logprobs == want.logprobs  # every logit of each drawing row, through log_softmax


def all_free(llm):
    host = llm.engine.host
    assert not llm.engine.backend.bound and not host.live and not host.waiting
    assert host.sessions.num_free == len(llm.engine.sessions)


def fresh_run(fresh, prompt, params):
    return fresh.generate(prompt, dataclasses.replace(params, draft=False))[0]


@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
@pytest.mark.parametrize("params", PARAMS)
def test_resent_prompt_equals_fresh(oracle_by_name, fresh_of, name, params):
    cached = LLM(str(oracle_by_name(name)), costs=COSTS, parallel=2, max_rows=16)
    fresh = fresh_of(name)
    prompt = ids(300, 1)
    first, again = (cached.generate(prompt, params)[0] for _ in range(2))
    assert (first.stats.cached_tokens, again.stats.cached_tokens) == (0, 256)
    want = fresh_run(fresh, prompt, params)
    same(first, want)
    same(again, want)
    all_free(cached)


@pytest.mark.parametrize("params", PARAMS[::3])
def test_extended_by_a_chat_turn_equals_fresh(cached, fresh, params):
    turn1 = ids(200, 2)
    reply = cached.generate(turn1, params)[0]
    turn2 = [*turn1, *reply.token_ids, *ids(90, 3)]
    got = cached.generate(turn2, params)[0]
    assert got.stats.cached_tokens == 192  # turn 1's mark
    same(got, fresh_run(fresh, turn2, params))
    all_free(cached)


def test_branches_from_one_system_prompt(cached, fresh):
    system = ids(150, 4)
    branches = [[*system, *ids(70, 5)], [*system, *ids(100, 6)]]
    outs = cached.generate(branches, GREEDY, boundaries=[[150], [150]])
    assert [o.stats.cached_tokens for o in outs] == [0, 0]
    third = [*system, *ids(40, 7)]
    out = cached.generate(third, GREEDY, boundaries=[[150]])[0]
    assert out.stats.cached_tokens == 128  # the system prompt's boundary mark
    for prompt, got in zip([*branches, third], [*outs, out]):
        same(got, fresh_run(fresh, prompt, GREEDY))
    all_free(cached)


def test_eviction_under_a_small_budget(tiny_ckpt, fresh):
    # room for two kept 256-token states (with the MTP head's rows: about 0.66 MB each)
    budget_gb = 1.5e6 / 2**30
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=1, max_rows=16, prompt_cache_gb=budget_gb)
    cache = llm.engine.host.cache
    p = [ids(300, 10 + i) for i in range(3)]
    order = [p[0], p[1], p[0], p[2], p[0], p[1]]
    outs = [llm.generate(prompt, GREEDY)[0] for prompt in order]
    # p[2] evicts p[1], never resumed, not the older p[0], which was
    assert [o.stats.cached_tokens for o in outs] == [0, 0, 256, 0, 256, 0]
    assert 0 < cache.num_bytes <= cache.capacity_bytes and len(cache.entries) == 2
    assert set(llm.engine.backend.kept) == set(cache.entries)
    for prompt, got in zip(order, outs):
        same(got, fresh_run(fresh, prompt, GREEDY))
    all_free(llm)


def test_kept_entry_outlives_its_session_taken_by_a_live_stream(tiny_ckpt, fresh):
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=1, max_rows=16)
    a, b = ids(300, 20), ids(200, 21)
    first = llm.generate(a, GREEDY)[0]
    # b's stream takes the only session while a's state stays kept; then a resumes
    outs = llm.generate([b, a], GREEDY)
    assert [o.stats.cached_tokens for o in outs] == [0, 256]
    same(first, fresh_run(fresh, a, GREEDY))
    same(outs[0], fresh_run(fresh, b, GREEDY))
    same(outs[1], first)
    all_free(llm)


@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
def test_resumed_state_is_bit_equal_to_the_fresh_one(oracle_by_name, name):
    """Cut at the same marks, the resumed prefill computes the fresh one's exact bits (fp64
    states and fp32 logits), not just the same rounded logits."""
    cfg, model = load_checkpoint(oracle_by_name(name), dtype=torch.float64)
    sessions = [SessionState.empty(cfg, 512, torch.float64, torch.float64) for _ in range(2)]
    b = ModelBackend(model, sessions, max_rows=16)
    prompt = ids(300, 30)
    draws = Draws(GREEDY, 0, prompt, [])
    logits = []
    real = model.logits
    model.logits = lambda r: logits.append(real(r)) or logits[-1]
    try:
        pieces = [(0, 0, 256), (0, 256, 300)]
        for stream_id, a, z in pieces:
            w = Window(stream_id, stream_id, a, tuple(prompt[a:z]), draws, "prompt", z == 300)
            b.verify([w])
            b.keep({stream_id: z - a})
            if z == 256:
                b.keep_state(0, entry_id=7)
        assert b.resume(1, 1, entry_id=7) == 256
        b.verify([Window(1, 1, 256, tuple(prompt[256:]), draws, "prompt", True)])
        b.keep({1: 44})
    finally:
        model.logits = real
    assert torch.equal(logits[0], logits[1])
    s0, s1 = sessions
    assert s0.length == s1.length == 300
    for x, y in zip(s0.gdn.values(), s1.gdn.values()):
        assert torch.equal(x.recurrent, y.recurrent) and torch.equal(x.conv, y.conv)
    for x, y in zip(s0.attn.values(), s1.attn.values()):
        assert torch.equal(x.k[:300], y.k[:300]) and torch.equal(x.v[:300], y.v[:300])
        assert torch.equal(x.block_keys[:75], y.block_keys[:75])
    for x, y in zip(s0.ple.values(), s1.ple.values()):
        assert torch.equal(x.conv, y.conv) and torch.equal(x.ids, y.ids)
