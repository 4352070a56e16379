"""A lone call whose streams end at different steps (lanes/lone_turn.run_lone): a stream
whose reply ends rides along while the others go on, unless requests wait for a session
(then the call ends after that step, so its release admits them). Streams that drafted end
steps apart, and each end cut the call short: 16 greedy streams of 64 tokens on the H100
ran 13 calls, the last twelve of one to four steps (ccd8297, benchmarks/round_trace.py)."""

import dataclasses

import pytest

from flashlane.llm import LLM
from tests.runner.test_exact import COSTS, prompts
from tests.runner.test_lone import GREEDY, with_lone, without_lone


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)


def spied(driver, name: str, calls: list):
    """Record (sessions, budget, steps launched) of each of the driver's `name` calls."""
    fn = getattr(driver, name)

    def spy(ids, tokens, positions, budget, *args, **kwargs):
        launched = fn(ids, tokens, positions, budget, *args, **kwargs)
        calls.append((len(ids), budget, launched))
        return launched

    setattr(driver, name, spy)


def alone_then_lone(llm, ps, params):
    """Each reply alone through shared rounds, then all together on a lone driver of 32
    steps for up to 4 streams: (the replies alone, together, the driver's plain calls)."""
    without_lone(llm)
    want = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    driver = with_lone(llm, 32, streams=4)
    calls: list = []
    spied(driver, "decode_many", calls)
    try:
        got = [o.token_ids for o in llm.generate(ps, params)]
    finally:
        without_lone(llm)
    return want, got, calls


def test_a_call_goes_on_past_a_reply_that_ends(llm):
    """Three greedy replies of 6, 14 and 22 tokens: one lone call of 21 steps decodes them
    all (at 854e6e3: three calls, of 5, 8 and 8 steps), each reply as alone."""
    params = [dataclasses.replace(GREEDY, max_tokens=m) for m in (6, 14, 22)]
    want, got, calls = alone_then_lone(llm, prompts()[:3], params)
    assert got == want
    assert calls == [(3, 21, 21)]


def test_a_call_ends_at_a_reply_end_while_a_request_waits(tiny_ckpt):
    """Two sessions, three requests: the third waits for a session, so the call ends after
    the step in which the shorter reply ends (one more in flight), and the third is
    admitted in the next round. Every reply as alone."""
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=2, max_rows=16)
    params = [dataclasses.replace(GREEDY, max_tokens=m) for m in (6, 30, 10)]
    want, got, calls = alone_then_lone(llm, prompts()[:3], params)
    assert got == want
    sessions, budget, launched = calls[0]
    assert sessions == 2 and budget == 29 and launched <= 6


def test_drafted_calls_go_on_and_count_each_streams_own_drafts(tiny_ckpt):
    """Drafting streams of 4, 30 and 40 tokens: the first drafted call (a try: 8 steps, more
    while its landing pays) runs on though the shortest reply ends within its first three, and that
    reply's drafts are counted only for the steps before it ended. Replies as alone."""
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)
    ps = [prompts()[i] for i in (0, 2, 4)]  # 31 rows: one prompt round
    params = [dataclasses.replace(GREEDY, max_tokens=m, draft=True) for m in (4, 30, 40)]
    without_lone(llm)
    plain = [dataclasses.replace(q, draft=False) for q in params]
    want = [o.token_ids for o in llm.generate(ps, plain)]
    driver = with_lone(llm, 32, streams=4, drafter=llm.engine.host.backend.drafter)
    calls: list = []
    spied(driver.drafting, "decode", calls)
    try:
        outs = llm.generate(ps, params)
    finally:
        without_lone(llm)
    assert [o.token_ids for o in outs] == want
    assert calls[0][0] == 3 and calls[0][2] >= 8
    depth = driver.drafting.depth
    assert outs[0].stats.drafted <= depth * 3
