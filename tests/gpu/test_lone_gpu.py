"""The lone driver on the GPU: graphed and eager lone steps leave the session bit for bit where
one-row shared rounds leave it and draw the same tokens; through the engine, replies with the
lone driver equal replies through shared rounds, with hand-offs."""

import dataclasses

import pytest
import torch

from flashlane.drafting.mtp import MtpDrafter
from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.request import SamplingParams
from flashlane.runner.backend import copy_session
from flashlane.runner.lone import LoneDriver
from tests.gpu.test_exact_gpu import (  # noqa: F401
    SIBLINGS,
    gpu_model,
    new_session,
    prefilled,
    prompts,
    run_windows,
)
from tests.runner.test_absorb import head_cache
from tests.runner.test_lone import assert_same_states
from tests.runner.test_lone_beside import churn

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
# code prompts whose replies draft well on the embedded model
CODE = [
    "def fibonacci(n):\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "import os\n\n\ndef walk(path):\n",
    "    for key, value in sorted(items):\n",
]


@pytest.fixture
def lone_model(gpu_model):  # noqa: F811
    """gpu_model: every family has a lone step (a sibling's: lone_step.plain_step)."""
    return gpu_model


@pytest.fixture
def drafted_model(gpu_model):  # noqa: F811
    """gpu_model where the lone driver drafts: Flash Next (a sibling's drafting streams
    step plainly on it and draft in shared rounds)."""
    if gpu_model[0].family != "flashnext":
        pytest.skip(f"no drafted lone step for {gpu_model[0].family}")
    return gpu_model


def copy_of(cfg, base):
    """A new session holding base's state."""
    s = new_session(cfg)
    copy_session(base, s, cfg.indexer_block)
    return s


def greedy_rounds(model, ref, n: int) -> list[int]:
    """n one-row shared rounds from token 3, committed in ref: the reference tokens."""
    want = [3]
    for _ in range(n):
        want.append(int(run_windows(model, [(ref, want[-1:])], keep=True)[0][0].argmax()))
    return want


@pytest.mark.parametrize("graphed", [True, False])
@pytest.mark.parametrize("which", [3, 8])  # 130 and 200 prompt tokens
def test_lone_steps_equal_shared_rounds_bitwise(lone_model, graphed, which):
    cfg, model = lone_model
    base = prefilled(cfg, model, prompts(cfg.vocab_size, 9)[which])
    ref = copy_of(cfg, base)
    want = greedy_rounds(model, ref, 24)
    s = copy_of(cfg, base)
    driver = LoneDriver(model, [s], graphs=graphed)
    got = [3]

    def take(token, finite):
        assert finite
        got.append(token)
        return True

    n = driver.decode(0, 3, s.length, 10, take)
    n += driver.decode(0, got[-1], s.length, 14, take)  # a second call replays the same graph
    assert n == 24 and got == want
    assert len(driver.graphs) == (1 if graphed else 0)
    assert_same_states([s], [ref])


def test_engine_replies_lone_and_shared_agree(tiny_ckpt):
    costs = CostTable(
        {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2
    )
    llm = LLM(str(tiny_ckpt), costs=costs, parallel=4, max_rows=16, device="cuda")
    host = llm.engine.host
    lone = host.lone
    assert lone is not None and lone.use_graphs
    assert lone.max_rows == llm.engine.max_rows  # the plan's rows bound drafted steps
    ps = prompts(500, 6)
    params = [
        SamplingParams(max_tokens=m, temperature=0.0, draft=False) for m in (40, 9, 33, 1, 25, 60)
    ]
    host.lone = None
    want = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    host.lone = lone
    got = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    assert got == want and lone.num_steps > 0
    # hand-offs: every fifth landed step "work arrives"; then all six at once (shared rounds)
    calls = [0]
    host.interrupted = lambda: calls.__setitem__(0, calls[0] + 1) or calls[0] % 5 == 0
    host.config = dataclasses.replace(host.config, lone_steps=8)
    got = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    together = [o.token_ids for o in llm.generate(ps, params)]
    assert got == want and together == want


@pytest.mark.parametrize("name", ["tiny", *sorted(SIBLINGS)])
def test_replies_under_churn_equal_each_alone(oracle_by_name, name):
    """Issue 28's churn gate on the GPU (tests/runner/test_lone_beside.py `churn`): requests
    arriving every few rounds while others decode and end, greedy and seeded, drafting on for
    most, on five sessions: every reply equals the same request alone. The lone driver takes
    the decoders beside the prompt pieces, in its graphs of every size (a sibling's drafting
    streams draft in shared rounds between their lone steps)."""
    costs = CostTable(
        {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2
    )
    path = oracle_by_name(name)
    llm = LLM(str(path), costs=costs, parallel=5, max_rows=16, device="cuda")
    lone = llm.engine.host.lone
    assert lone is not None and lone.use_graphs
    steps = lone.num_steps
    got, want = churn(llm, prompts(500, 12))
    assert got == want
    assert lone.num_steps > steps and lone.widest >= 3


@pytest.mark.parametrize("graphed", [True, False])
def test_sessions_together_equal_shared_rounds_bitwise(lone_model, graphed):
    """Three sessions in lockstep on the lone driver (one graph for the tuple) leave each
    session bit for bit where its one-row shared rounds leave it."""
    cfg, model = lone_model
    sessions, refs, wants = [], [], []
    for which in (3, 8, 5):
        base = prefilled(cfg, model, prompts(cfg.vocab_size, 9)[which])
        ref = copy_of(cfg, base)
        wants.append(greedy_rounds(model, ref, 12))
        sessions.append(copy_of(cfg, base))
        refs.append(ref)
    driver = LoneDriver(model, sessions, graphs=graphed)
    got = [[3], [3], [3]]
    takes = [lambda t, f, i=i: bool(got[i].append(t)) or True for i in range(3)]
    starts = [s.length for s in sessions]
    n = driver.decode_many([0, 1, 2], [3, 3, 3], starts, 12, takes, [-1] * 3, [None] * 3)
    assert n == 12 and got == wants
    assert len(driver.graphs) == (1 if graphed else 0)
    assert_same_states(sessions, refs)


def test_one_graph_per_size_serves_any_sessions(lone_model):
    """Plain steps run in graphs of 1, 2, 4, ... rows whatever the sessions (their tables
    written before each call): calls of different tuples of five sessions, three of them
    with a pad row, reuse their size's graph, and each session ends bit for bit where its
    one-row shared rounds leave it, with their tokens."""
    cfg, model = lone_model
    which = (3, 8, 5, 1, 6)
    bases = [prefilled(cfg, model, prompts(cfg.vocab_size, 9)[w]) for w in which]
    calls = [[4, 0, 2], [2, 4], [1, 3, 0], [3], [0, 1, 2, 3, 4], [3, 1, 4]]
    steps = {i: sum(5 for c in calls if i in c) for i in range(5)}
    refs = [copy_of(cfg, b) for b in bases]
    wants = [greedy_rounds(model, r, steps[i]) for i, r in enumerate(refs)]
    sessions = [copy_of(cfg, b) for b in bases]
    driver = LoneDriver(model, sessions, graphs=True)
    assert driver.sizes == [1, 2, 4, 5]
    got = [[3] for _ in range(5)]
    for ids in calls:
        takes = [lambda t, f, i=i: bool(got[i].append(t)) or f for i in ids]
        n = driver.decode_many(
            ids,
            [got[i][-1] for i in ids],
            [sessions[i].length for i in ids],
            5,
            takes,
            [-1] * len(ids),
            [None] * len(ids),
        )
        assert n == 5
    assert got == wants
    assert sorted(driver.graphs) == [("size", 1), ("size", 2), ("size", 4), ("size", 5)]
    assert_same_states(sessions, refs)


@pytest.mark.parametrize("graphed", [True, False])
@pytest.mark.parametrize("depth,b", [(2, 1), (3, 2), (2, 3)])
def test_drafted_steps_equal_shared_rounds_bitwise(drafted_model, graphed, depth, b):
    """Drafted lone steps (runner/lone_draft.py), graphed or eager, alone or with others
    (three: the graph of four rows, one the pad session's): the kept draws are the one-row
    rounds' tokens and each session ends bit for bit where those rounds leave it. Each
    call's hints (its first drafts) are the true continuation, so its first step keeps every
    row of its window (random heads' own drafts rarely land)."""
    cfg, model = drafted_model
    bases, wants = [], []
    for which in (3, 8, 5)[:b]:
        base = prefilled(cfg, model, prompts(cfg.vocab_size, 9)[which])
        wants.append(greedy_rounds(model, copy_of(cfg, base), 48))
        bases.append(base)
    sessions = [copy_of(cfg, base) for base in bases]
    driver = LoneDriver(model, sessions, graphs=graphed, drafter=MtpDrafter(model, 0.0))
    drafting = driver.drafting
    drafting.depth = depth
    got = [[3] for _ in range(b)]
    takes = [lambda t, f, i=i: bool(got[i].append(t)) or True for i in range(b)]
    while min(len(g) for g in got) < 20:
        drafting.carry = {}
        drafting.decode(
            list(range(b)),
            [g[-1] for g in got],
            [s.length for s in sessions],
            3,
            400,
            takes,
            list(range(b)),
            [None] * b,
            [wants[i][len(got[i]) : len(got[i]) + depth] for i in range(b)],  # hints
        )
    assert drafting.num_landed >= depth
    for i, s in enumerate(sessions):
        assert got[i] == wants[i][: len(got[i])]
        ref = copy_of(cfg, bases[i])
        for token in got[i][:-1]:
            run_windows(model, [(ref, [token])], keep=True)
        assert_same_states([s], [ref])


def test_engine_drafted_lone_replies_equal_plain_replies():
    """The embedded model on the GPU: drafting streams decode on drafted lone steps, alone
    and four together, their drafts land, and every reply equals its undrafted one."""
    costs = CostTable(
        {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2
    )
    llm = LLM(costs=costs, parallel=4, max_rows=16, device="cuda", lone_streams=4)
    lone = llm.engine.host.lone
    assert lone is not None and lone.drafting is not None
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    plain = dataclasses.replace(params, draft=False)
    want = [llm.generate(p, plain)[0].token_ids for p in CODE]
    got = [llm.generate(p, params)[0].token_ids for p in CODE]
    assert got == want
    assert [o.token_ids for o in llm.generate(CODE, params)] == want
    assert lone.drafting.num_landed > 0.3 * lone.drafting.num_drafted > 0


def test_drafted_replies_after_warm_rounds_equal_plain_replies():
    """`flashlane serve`'s start on the GPU: warm rounds, then drafting streams whose drafted
    calls absorb their cells through the graphs captured at engine start. Warm rounds had
    rebuilt the Drafting whose absorber's buffers those graphs read, and served requests met
    an illegal memory access (1670cd1; 9a2b8a0 restarts it in place). Every reply equals its
    undrafted one, and graphed absorbs ran."""
    from flashlane.lanes.warm_start import warm_start

    costs = CostTable(
        {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2
    )
    llm = LLM(costs=costs, parallel=4, max_rows=16, device="cuda", lone_streams=4)
    host, lone = llm.engine.host, llm.engine.host.lone
    absorber = lone.drafting.absorber
    warm_start(host, llm.engine.model_config.vocab_size)
    assert lone.drafting.absorber is absorber
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    want = [llm.generate(p, dataclasses.replace(params, draft=False))[0].token_ids for p in CODE]
    graphed = absorber.num_graphed
    assert [o.token_ids for o in llm.generate(CODE, params)] == want
    assert absorber.num_graphed > graphed and lone.drafting.num_landed > 0


def test_graphed_absorbs_write_the_head_caches_as_eager_ones(drafted_model):
    """A drafted call's load (runner/absorb.py): three streams' 150, 20 and 9 waiting cells
    through the bucket graphs (calls of 64 and 64 rows, then 22 + 20 + 9 in the bucket of 64,
    its pad rows on the pad session) write each head cache bit for bit as the same cells
    absorbed eagerly (the same calls, their rows alone)."""
    cfg, model = drafted_model
    base = prefilled(cfg, model, prompts(cfg.vocab_size, 9)[3])
    gen = torch.Generator(device="cuda").manual_seed(0)
    cells, width = [150, 20, 9], cfg.hc_count * cfg.hidden_size
    res = [torch.randn(n, width, generator=gen, device="cuda").to(torch.bfloat16) for n in cells]
    got = []
    for graphed in (True, False):
        sessions = [copy_of(cfg, base) for _ in cells]
        drafter = MtpDrafter(model, 0.0)
        for i, (s, n) in enumerate(zip(sessions, cells)):
            s.mtp_length = 0
            ids = [(7 * j + 3 + i) % cfg.vocab_size for j in range(n)]
            drafter.absorb_later(i, res[i].clone(), [3, *ids[:-1]], ids[-1], None)
        driver = LoneDriver(model, sessions, graphs=graphed, drafter=drafter)
        absorber, streams = driver.drafting.absorber, [0, 1, 2]
        drafter.absorb_waiting(streams, dict(enumerate(sessions)), [3] * 3, cells=absorber)
        assert [s.mtp_length for s in sessions] == cells
        assert (absorber.num_graphed, absorber.num_eager) == ((3, 0) if graphed else (0, 3))
        got.append([head_cache(s, n) for s, n in zip(sessions, cells)])
    for want, have in zip(*got):
        for a, b in zip(want, have):
            assert torch.equal(a, b)
