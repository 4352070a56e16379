"""The lone driver (runner/lone.py) on the CPU: its steps leave a session bit for bit where
shared one-row rounds leave it, and through the host its replies equal shared rounds' replies,
across hand-offs to shared rounds and back, stops inside a burst and interruptions."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CHUNK, Draws, Window
from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from flashlane.runner.lone import LoneDriver
from flashlane.sessions.prompt_cache import PromptCache
from tests.runner.test_exact import COSTS, prompts, serial

GREEDY = SamplingParams(max_tokens=40, temperature=0.0, draft=False)


def prefilled(model, cfg, prompt):
    s = SessionState.empty(cfg, 512, torch.float64, torch.float64)
    b = ModelBackend(model, [s], max_rows=16)
    v = b.verify([Window(0, 0, 0, tuple(prompt), Draws(GREEDY, 0, prompt, []), "prompt", True)])
    b.keep({0: len(prompt)})
    return s, v[0].sampled[0]


def state_of(s: SessionState) -> list[torch.Tensor]:
    """Every tensor the session reads back: caches up to its length, whole recurrent state."""
    n, out = s.length, []
    for c in s.attn.values():
        blocks = n // (c.k.shape[0] // c.block_keys.shape[0])
        out += [c.k[:n], c.v[:n], c.index_keys[:n], c.block_keys[:blocks]]
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


def test_decoders_stay_lone_beside_a_filling_prompt(llm):
    """A request arriving while two streams decode on the lone driver: its prompt runs in
    pieces in shared rounds of its own, and between the pieces the decoders take lone steps
    (they never go back to shared rounds). Every reply equals its reply through shared
    rounds alone."""
    host = llm.engine.host
    ps = prompts()[:3]
    ps[2] = ps[2] * 8  # 136 tokens: three pieces of up to 64 rows
    params = [dataclasses.replace(GREEDY, max_tokens=m) for m in (60, 56, 12)]
    without_lone(llm)
    want = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    driver = with_lone(llm, 4, streams=8)
    host.config = dataclasses.replace(host.config, prefill_rows=CHUNK)
    beside, shared_decodes = [], []
    decode_many, verify = driver.decode_many, host.backend.verify

    def spy_decode(*args, **kwargs):
        beside.append(any(s.is_filling for s in host.live))
        return decode_many(*args, **kwargs)

    def spy_verify(windows):
        shared_decodes.extend(w.stream_id for w in windows if w.kind == "decode")
        return verify(windows)

    driver.decode_many, host.backend.verify = spy_decode, spy_verify
    cache, host.cache = host.cache, PromptCache(0)  # "c" fills from zero, in pieces
    try:
        ids = "abc"
        out = {k: [] for k in ids}
        for rid, p, q in zip(ids[:2], ps, params):
            host.submit(rid, p, q)
        rounds = 0
        while host.has_work:
            rounds += 1
            if rounds == 4:
                host.submit("c", ps[2], params[2])
            for u in host.run_once():
                out[u.stream.request_id] += u.token_ids
    finally:
        host.backend.verify, host.cache = verify, cache
        host.config = dataclasses.replace(host.config, prefill_rows=1024)
        without_lone(llm)
    assert [out[k] for k in ids] == want
    assert sum(beside) >= 2  # lone calls while "c" filled, after each of its first pieces
    assert shared_decodes == []  # no decode window went through a shared round


def test_streams_the_lone_driver_takes_get_no_shared_drafts(llm):
    """Drafting streams that leave their prompt for the lone driver: the shared round that
    ends their prompt drafts nothing for them (the driver clears held drafts: the MTP head's
    work would be lost), and the replies are the undrafted ones."""
    host = llm.engine.host
    ps = prompts()[:3]
    params = [dataclasses.replace(GREEDY, max_tokens=m, draft=True) for m in (30, 20, 25)]
    without_lone(llm)
    want = [
        o.token_ids for o in llm.generate(ps, [dataclasses.replace(q, draft=False) for q in params])
    ]
    drafted, draft = [], host.backend.draft
    host.backend.draft = lambda depths: drafted.append(dict(depths)) or draft(depths)
    try:
        got, driver = lone_run(
            llm, lambda: [o.token_ids for o in llm.generate(ps, params)], 8, streams=8
        )
        assert got == want and driver.num_steps > 0
        assert drafted == []
    finally:
        host.backend.draft = draft


def test_a_drafting_stream_on_the_driver_keeps_a_bounded_queue(llm, monkeypatch):
    """A drafting stream that stays on the lone driver queues a cell per token for its MTP
    head; past MAX_WAITING the head absorbs them, so the queue (a residual row each) stays
    bounded over a long reply, and the reply is the undrafted one."""
    import flashlane.runner.lone as lone_mod

    monkeypatch.setattr(lone_mod, "MAX_WAITING", 8)
    host = llm.engine.host
    prompt = prompts()[1]
    params = dataclasses.replace(GREEDY, max_tokens=60, draft=True)
    without_lone(llm)
    want = llm.generate(prompt, dataclasses.replace(params, draft=False))[0].token_ids
    driver = with_lone(llm, 4, drafter=host.backend.drafter)
    driver.drafting = None  # plain steps only: their cells queue
    queued, decode_many = [], driver.decode_many

    def spy(*args, **kwargs):
        n = decode_many(*args, **kwargs)
        queued.extend(len(w.next_ids) for w in host.backend.drafter.waiting.values())
        return n

    driver.decode_many = spy
    try:
        got = llm.generate(prompt, params)[0].token_ids
    finally:
        without_lone(llm)
    assert got == want
    assert len(queued) >= 10 and max(queued) < 8 + 4  # absorbed each time it passed 8


def churn(llm, ps, every: int = 2):
    """Requests arriving every `every` rounds while others decode and end (greedy, seeded
    sampled, top_p and top_k among them, drafting on for two in three, max_tokens 12 up),
    prompts in pieces of 64 rows, lone calls of 4 steps, on the llm's sessions (some wait for
    one): (each reply, the same request served alone)."""
    host = llm.engine.host
    kinds = [
        dict(temperature=0.0),
        dict(temperature=0.8, seed=7),
        dict(temperature=1.1, top_p=0.9, seed=11),
        dict(temperature=0.6, top_k=20, seed=5),
    ]
    params = [
        SamplingParams(max_tokens=12 + 7 * i, draft=i % 3 != 2, **kinds[i % 4])
        for i in range(len(ps))
    ]
    want = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
    config = host.config
    host.config = dataclasses.replace(config, prefill_rows=CHUNK, lone_steps=4)
    out: dict[int, list[int]] = {i: [] for i in range(len(ps))}
    rounds = 0
    try:
        while rounds // every < len(ps) or host.has_work:
            if rounds % every == 0 and rounds // every < len(ps):
                i = rounds // every
                host.submit(str(i), ps[i], params[i])
            rounds += 1
            for u in host.run_once():
                out[int(u.stream.request_id)] += u.token_ids
    finally:
        host.config = config
    return [out[i] for i in range(len(ps))], want


def test_replies_under_churn_equal_each_alone(tiny_ckpt):
    """The churn gate on the CPU: the lone driver (eager here) takes every decoder it can
    draw for, with drafting on, beside prompt pieces and streams it cannot take; every reply
    equals the same request alone, and the driver decoded several streams together."""
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=5, max_rows=16)
    host = llm.engine.host
    driver = LoneDriver(llm.engine.model, llm.engine.sessions, drafter=host.backend.drafter)
    host.lone = driver
    host.config = dataclasses.replace(host.config, lone_streams=5)
    got, want = churn(llm, [p * 2 for p in prompts()[:10]])
    assert got == want
    assert driver.num_steps > 100 and driver.widest >= 3


def test_size_tables_name_sessions_from_the_anchor(tiny_ckpt):
    """runner/lone_buffers.SizeTables: a plain step's tables name its sessions by offsets from
    the largest session's buffers, rows past them the pad session, every layer stacked in
    `keys` order; kept by tuple of sessions."""
    from flashlane.runner.lone_buffers import SizeTables

    cfg, _ = load_checkpoint(tiny_ckpt, dtype=torch.float32)
    sessions = [
        SessionState.empty(cfg, cap, torch.float32, torch.float32) for cap in (128, 512, 256)
    ]
    tables = SizeTables(cfg, sessions, 64, torch.device("cpu"))
    assert tables.anchor is sessions[1] and tables.pad.capacity >= 65
    got = tables.of((2, 0), 4)
    assert got.shape == (len(tables.keys), 4, 8) and tables.of((2, 0), 4) is got
    rows = [sessions[2], sessions[0], tables.pad, tables.pad]
    for key, table in zip(tables.keys, got):
        if isinstance(key, tuple):  # a PLE layer's: conv tail, ids
            bufs = [[s.ple[key[1]].conv for s in rows], [s.ple[key[1]].ids for s in rows]]
            base = [tables.anchor.ple[key[1]].conv, tables.anchor.ple[key[1]].ids]
        elif key in tables.anchor.gdn:
            bufs = [[s.gdn[key].recurrent for s in rows], [s.gdn[key].conv for s in rows]]
            base = [tables.anchor.gdn[key].recurrent, tables.anchor.gdn[key].conv]
        else:
            bufs = [[s.attn[key].k for s in rows], [s.attn[key].block_keys for s in rows]]
            base = [tables.anchor.attn[key].k, tables.anchor.attn[key].block_keys]
        cols = (0, 1) if isinstance(key, tuple) or key in tables.anchor.gdn else (0, 3)
        for col, column, b in zip(cols, bufs, base):
            for row, buf in enumerate(column):
                at = b.data_ptr() + int(table[row, col]) * b.element_size()
                assert at == buf.data_ptr()
