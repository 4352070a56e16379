"""The lone driver (runner/lone.py) on the CPU: its steps leave a session bit for bit where
shared one-row rounds leave it, and through the host its replies equal shared rounds' replies,
across hand-offs to shared rounds and back, stops inside a burst and interruptions."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import Draws, Window
from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from flashlane.runner.lone import LoneDriver
from tests.runner.test_exact import COSTS, prompts, serial

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, draft=False)


def prefilled(model, cfg, prompt):
    s = SessionState.empty(cfg, 512, torch.float64, torch.float64)
    b = ModelBackend(model, [s], max_rows=16)
    v = b.verify([Window(0, 0, 0, tuple(prompt), Draws(GREEDY, 0, prompt, []), "prompt", True)])
    b.keep({0: len(prompt)})
    return s, v[0].sampled[0]


def state_of(s: SessionState) -> list[torch.Tensor]:
    """Every tensor the session reads back: caches up to its length (8-bit ones with their
    scales; a sibling's zero-wide indexer keys' scales are never read), whole recurrent
    state."""
    n, out = s.length, []
    for c in s.attn.values():
        blocks = n // (c.k.shape[0] // c.block_keys.shape[0])
        unread = c.index_scale if c.index_keys.shape[-1] == 0 else None
        out += [t[:blocks] if t is c.block_keys else t[:n] for t in c.tensors() if t is not unread]
    for g in s.gdn.values():
        out += [g.conv, g.recurrent]
    for p in s.ple.values():
        out += [p.conv, p.ids]
    return out


def assert_same_states(sessions, refs) -> None:
    """Each session bitwise its reference's: its length and every tensor it reads back."""
    for s, ref in zip(sessions, refs):
        assert s.length == ref.length
        for a, b in zip(state_of(s), state_of(ref)):
            assert torch.equal(a, b)


@pytest.mark.parametrize("which", [1, 3])  # 70 and 130 prompt tokens: sparse blocks chosen
def test_lone_steps_equal_shared_rounds_bit_for_bit(tiny_ckpt, which):
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[which]
    want, ref = serial(model, cfg, prompt, 30)
    s, first = prefilled(model, cfg, prompt)
    assert first == want[0]
    got: list[int] = [first]
    driver = LoneDriver(model, [s])

    def take(token, finite):
        assert finite
        got.append(token)
        return True

    # two calls: the second starts from the first's last token, as the host hands it back
    n = driver.decode(0, got[-1], len(prompt), 12, take)
    n += driver.decode(0, got[-1], len(prompt) + n, 17, take)
    assert n == 29 and got == want
    assert s.length == ref.length == len(prompt) + 29
    assert_same_states([s], [ref])


def test_sessions_decoded_together_equal_each_alone(tiny_ckpt):
    """Three sessions in lockstep on the lone driver (their attention, pooling and state
    commits per session, the rest batched): each one's tokens are its tokens alone, and its
    state where one-stream shared rounds leave it. Bit for bit only where the GEMM is
    row-invariant (the GPU's kernels: tests/gpu); the CPU's fp64 GEMM may round a batched
    row's last bit differently, so here the states agree to 1e-12."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    ps = [prompts()[i] for i in (0, 1, 3)]
    sessions, refs, wants, got = [], [], [], []
    for p in ps:
        want, ref = serial(model, cfg, p, 20)
        s, first = prefilled(model, cfg, p)
        assert first == want[0]
        sessions.append(s)
        refs.append(ref)
        wants.append(want)
        got.append([first])
    driver = LoneDriver(model, sessions)

    def take_for(i):
        def take(token, finite):
            assert finite
            got[i].append(token)
            return True

        return take

    takes = [take_for(i) for i in range(3)]
    starts = [len(p) for p in ps]
    n = driver.decode_many([0, 1, 2], [g[-1] for g in got], starts, 8, takes, [-1] * 3,
                           [None] * 3)  # fmt: skip
    n += driver.decode_many([2, 0, 1], [got[i][-1] for i in (2, 0, 1)],
                            [starts[i] + n for i in (2, 0, 1)], 11,
                            [takes[i] for i in (2, 0, 1)], [-1] * 3, [None] * 3)  # fmt: skip
    assert n == 19 and got == wants
    for s, ref in zip(sessions, refs):
        assert s.length == ref.length
        for a, b in zip(state_of(s), state_of(ref)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_lone_calls_fold_step_and_load_times(tiny_ckpt):
    """A greedy call of four steps or more folds its mean step time into step_ms and its time
    before the first step into load_ms (what drafting weighs), by (sessions, depth), less a
    graph captured in the call; a shorter call, or one in which a kernel compiled, folds
    nothing."""
    import time

    from flashlane.kernels import compiles

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[0]
    s, first = prefilled(model, cfg, prompt)
    driver = LoneDriver(model, [s])
    driver.decode(0, first, len(prompt), 3, lambda t, f: True)
    assert driver.step_ms == {} and driver.load_ms == {}
    runner = driver.runner

    def capturing(ids, io):  # a capture of 0.2 s in the call: not the call's load
        time.sleep(0.2)
        driver.capture_seconds += 0.2
        return runner(ids, io)

    driver.runner = capturing
    driver.decode(0, first, s.length, 6, lambda t, f: True)
    assert set(driver.step_ms) == set(driver.load_ms) == {(1, 0)}
    assert driver.step_ms[(1, 0)] > 0 and 0 <= driver.load_ms[(1, 0)] < 100
    # a call in which a Triton kernel compiled timed the compiler: it folds nothing
    folded = dict(driver.step_ms), dict(driver.load_ms)

    def compiling(ids, io):
        compiles._count += 1
        return runner(ids, io)

    driver.runner = compiling
    driver.decode(0, first, s.length, 6, lambda t, f: True)
    assert (driver.step_ms, driver.load_ms) == folded


def test_lone_stops_after_a_landed_step_and_lands_the_one_in_flight(tiny_ckpt):
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[0]
    want, _ = serial(model, cfg, prompt, 12)
    s, first = prefilled(model, cfg, prompt)
    got = [first]
    n = LoneDriver(model, [s]).decode(0, first, len(prompt), 10, lambda t, f: bool(got.append(t)))
    # it said stop after the first landed step; the second was in flight and landed too
    assert n == 2 and got == want[:3] and s.length == len(prompt) + 2


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)


def with_lone(llm, steps: int, streams: int = 1, drafter=None):
    host = llm.engine.host
    host.lone = LoneDriver(llm.engine.model, llm.engine.sessions, drafter=drafter)
    host.config = dataclasses.replace(host.config, lone_steps=steps, lone_streams=streams)
    return host.lone


def without_lone(llm):
    llm.engine.host.lone = None
    llm.engine.host.interrupted = lambda: False


def lone_run(llm, fn, steps: int, streams: int = 1, drafter=None):
    """(fn() with the lone driver on, the driver); the driver is off again after."""
    driver = with_lone(llm, steps, streams, drafter)
    try:
        return fn(), driver
    finally:
        without_lone(llm)


def with_arrivals(
    llm,
    ps,
    params,
    at_round: int,
    interrupt_every: int | None = None,
    lone_until: int | None = None,
):
    """The first request alone, the others submitted at round `at_round` (lone driver
    on), every round run: (each request's tokens, each request's stream). With
    `interrupt_every`, work "arrives" at every that many landed tokens (the host is
    interrupted); with `lone_until`, the lone driver is off from that round on. Turns the
    lone driver off at the end."""
    host = llm.engine.host
    if interrupt_every:
        calls = [0]

        def interrupted():
            calls[0] += 1
            return calls[0] % interrupt_every == 0

        host.interrupted = interrupted
    ids = "abcdefgh"[: len(ps)]
    out: dict[str, list[int]] = {k: [] for k in ids}
    streams: dict = {}
    try:
        host.submit(ids[0], ps[0], params[0])
        rounds = 0
        while host.has_work:
            rounds += 1
            if rounds == at_round:
                for rid, p, q in zip(ids[1:], ps[1:], params[1:]):
                    host.submit(rid, p, q)
            if rounds == lone_until:
                host.lone = None
            for u in host.run_once():
                out[u.stream.request_id] += u.token_ids
                streams[u.stream.request_id] = u.stream
    finally:
        without_lone(llm)
    return [out[k] for k in ids], streams


@pytest.mark.parametrize("steps", [1, 5, 32])
def test_lone_replies_equal_shared_replies(llm, steps):
    ps = prompts()[:5]
    params = [dataclasses.replace(GREEDY, max_tokens=m) for m in (40, 7, 33, 1, 25)]
    without_lone(llm)
    want = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    driver = with_lone(llm, steps)
    try:
        got = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    finally:
        without_lone(llm)
    assert got == want
    assert driver.num_steps >= sum(len(w) - 1 for w in want) - 1  # the lone driver decoded


@pytest.mark.parametrize("draft", [False, True])
def test_streams_together_on_the_lone_driver_reply_as_shared_rounds(llm, tiny_ckpt, draft):
    """Up to four greedy streams decode together on the lone driver; each stops at its own
    length (the burst stops after the step one of them ends in, the rest go on), replies
    equal shared rounds' (drafting streams: their cells queued for their MTP heads; on an
    engine of their own, as the drafts' acceptance counts are the engine's)."""
    if draft:
        llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)
    ps = prompts()[:5]
    params = [dataclasses.replace(GREEDY, max_tokens=m, draft=draft) for m in (40, 7, 33, 1, 25)]
    without_lone(llm)
    want = [
        o.token_ids for o in llm.generate(ps, [dataclasses.replace(q, draft=False) for q in params])
    ]
    got, driver = lone_run(
        llm, lambda: [o.token_ids for o in llm.generate(ps, params)], 6, streams=4
    )
    assert got == want
    assert driver.num_steps > 10 and driver.widest == 4


def test_lone_stop_token_inside_a_burst(llm):
    prompt = prompts()[2]
    without_lone(llm)
    full = llm.generate(prompt, GREEDY)[0].token_ids
    stop = dataclasses.replace(GREEDY, stop_token_ids=[full[9]])
    want = llm.generate(prompt, stop)[0]
    with_lone(llm, 32)
    try:
        got = llm.generate(prompt, stop)[0]
    finally:
        without_lone(llm)
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
    assert len(got.token_ids) <= 10


def test_lone_hands_off_when_work_arrives_and_takes_back(llm):
    """Requests arriving while a lone stream decodes: it goes back to shared rounds (the host
    is interrupted), and every reply equals its reply alone."""
    ps = prompts()[:4]
    params = [dataclasses.replace(GREEDY, max_tokens=m) for m in (30, 12, 20, 8)]
    without_lone(llm)
    want = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    driver = with_lone(llm, 4)
    # the others come while "a" runs alone; every seventh landed step, work "arrives"
    got, _ = with_arrivals(llm, ps, params, 6, interrupt_every=7)
    assert got == want
    assert driver.num_steps > 0


def test_drafting_streams_go_lone_and_draft_again_after_the_hand_off(llm):
    """A drafting greedy stream runs on the lone driver, its cells queued for its MTP head;
    once the driver is gone it drafts in shared rounds. With the driver on throughout, it
    stays there while the others (past the driver's one stream here) share rounds beside it.
    Replies equal undrafted ones."""
    ps = prompts()[:4]
    params = [dataclasses.replace(GREEDY, max_tokens=m, draft=True) for m in (40, 12, 20, 8)]
    without_lone(llm)
    want = [
        llm.generate(p, dataclasses.replace(q, draft=False))[0].token_ids
        for p, q in zip(ps, params)
    ]
    driver = with_lone(llm, 6)
    got, streams = with_arrivals(llm, ps, params, 3, lone_until=3)
    assert got == want
    assert driver.num_steps > 0
    assert streams["a"].num_drafted > 0  # its head caught up on the lone cells and drafted
    driver = with_lone(llm, 6)  # the driver takes "a" throughout, the others share rounds
    got, streams = with_arrivals(llm, ps, params, 3)
    assert got == want
    assert driver.num_steps >= len(want[0]) - 1 and streams["a"].num_drafted == 0


def test_lone_stream_moves_to_a_larger_session_as_shared_rounds_move_it(tiny_ckpt):
    """A lone stream stops where its session is full; the host moves it to a larger session
    (sized sessions, a small grow margin) and it goes on, alone again: the same reply."""
    sized = LLM(str(tiny_ckpt), costs=COSTS, max_rows=16, slot_contexts="96,512", slot_grow=8)
    prompt = prompts()[1]  # 70 tokens: admitted to the 96-position session
    params = dataclasses.replace(GREEDY, max_tokens=120)
    without_lone(sized)
    want = sized.generate(prompt, params)[0]
    driver = with_lone(sized, 32)
    try:
        got = sized.generate(prompt, params)[0]
    finally:
        without_lone(sized)
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
    assert len(got.token_ids) == 120 and driver.num_steps > 100
    assert got.stats.moves == want.stats.moves >= 1


def test_lone_streams_option(monkeypatch):
    from flashlane.config import EngineConfig

    assert EngineConfig.resolve().lone_streams is None  # every session unless asked
    monkeypatch.setenv("FLASHLANE_LONE_STREAMS", "16")
    assert EngineConfig.resolve().lone_streams == 16
    assert EngineConfig.resolve(lone_streams=2).lone_streams == 2  # a kwarg wins
    with pytest.raises(ValueError, match="lone_streams"):
        EngineConfig.resolve(lone_streams=0)
    monkeypatch.setenv("FLASHLANE_LONE_STREAMS", "many")
    with pytest.raises(ValueError, match="not a number"):
        EngineConfig.resolve()
