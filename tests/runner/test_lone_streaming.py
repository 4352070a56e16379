"""A lone call hands a streaming caller (LaneHost.on_updates) each reply's new tokens as it
lands them (lanes/lone_turn.STREAM_EVERY apart), not only when the call ends: each token
once, in order, the reply unchanged; a caller without the hook (LLM.generate) sees rounds."""

import pytest

from flashlane.lanes import lone_turn
from flashlane.llm import LLM
from flashlane.request import SamplingParams
from tests.runner.test_exact import COSTS, prompts
from tests.runner.test_lone import lone_run


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16)


def streamed(llm, ps, params, every: float):
    """(the replies, each request's delivered updates: (tokens, finished) in order, mid-call
    ones marked, the lone driver)."""
    host = llm.engine.host
    seen: dict[str, list] = {}
    run_once = host.run_once

    def rounds():
        updates = run_once()
        for u in updates:
            seen.setdefault(u.stream.request_id, []).append((list(u.token_ids), u.finish, "round"))
        return updates

    def mid_call(updates):
        for u in updates:
            seen.setdefault(u.stream.request_id, []).append((list(u.token_ids), u.finish, "call"))

    host.run_once, host.on_updates = rounds, mid_call
    old, lone_turn.STREAM_EVERY = lone_turn.STREAM_EVERY, every
    try:
        outs, driver = lone_run(llm, lambda: llm.generate(ps, params), 32, streams=len(ps))
    finally:
        host.on_updates, lone_turn.STREAM_EVERY = None, old
        del host.run_once
    return outs, seen, driver


@pytest.mark.parametrize("every", [0.0, 1e9])
def test_lone_calls_stream_each_token_once_in_order(llm, every):
    ps = prompts()[:3]
    params = [SamplingParams(max_tokens=n, temperature=0.0, draft=False) for n in (40, 25, 33)]
    want = [o.token_ids for o in llm.generate(ps, params)]
    outs, seen, driver = streamed(llm, ps, params, every)
    assert [o.token_ids for o in outs] == want and driver.num_steps > 30
    for o in outs:
        ups = seen[o.request_id]
        assert [t for tokens, _, _ in ups for t in tokens] == o.token_ids  # once, in order
        assert [f for _, f, _ in ups[:-1]] == [None] * (len(ups) - 1) and ups[-1][1] is not None
        mid = [tokens for tokens, _, where in ups if where == "call"]
        if every == 0.0:  # every landed step but the reply's last: one token each
            assert len(mid) >= len(o.token_ids) - 3 and all(len(t) == 1 for t in mid)
        else:  # never due: the rounds deliver, as without the hook
            assert mid == []
