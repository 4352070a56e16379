"""The lone driver beside shared rounds: decoders keep their lone steps while prompt pieces
and streams the driver does not take run in rounds of their own, with requests arriving and
leaving (the churn gate, also run on the GPU by tests/gpu/test_lone_gpu.py), no shared drafts
for streams the driver takes next, a bounded MTP queue, and the size graphs' tables."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CHUNK
from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.lone import LoneDriver
from flashlane.sessions.prompt_cache import PromptCache
from tests.runner.test_exact import COSTS, prompts
from tests.runner.test_lone import GREEDY, lone_run, with_lone, without_lone


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)


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
    # a drafted step's tables name the MTP head's caches too, and after the sessions' rows
    # each session's row once per window row (depth 2: three times)
    drafted = tables.of((2, 0), 4, depth=2)
    assert drafted.shape == (len(tables.draft_keys), 4 + 4 * 3, 8)
    assert tables.draft_keys[: len(tables.keys)] == tables.keys
    assert torch.equal(drafted[: len(tables.keys), :4], got)
    assert torch.equal(drafted[:, 4:], drafted[:, :4].repeat_interleave(3, dim=1))
    for j, table in enumerate(drafted[len(tables.keys) :]):
        base = tables.anchor.mtp[j].k
        for row, s in enumerate(rows):
            at = base.data_ptr() + int(table[row, 0]) * base.element_size()
            assert at == s.mtp[j].k.data_ptr()


def test_the_anchor_spans_the_pad_session(tiny_ckpt):
    """Sessions smaller than the pad (a drafted call's reach): the pad is the anchor, so no
    row's keys or blocks lie past the anchor's (a smaller anchor: an illegal address on the
    H200, a corrupted heap under the interpreter)."""
    from flashlane.runner.lone_buffers import SizeTables

    cfg, _ = load_checkpoint(tiny_ckpt, dtype=torch.float32)
    sessions = [SessionState.empty(cfg, 64, torch.float32, torch.float32) for _ in range(2)]
    tables = SizeTables(cfg, sessions, 64 * 3, torch.device("cpu"))
    assert tables.pad.capacity > 64 * 3
    assert tables.anchor.capacity == max(s.capacity for s in [*sessions, tables.pad])
