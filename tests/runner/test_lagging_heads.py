"""A lone batch of more streams than a drafted step takes (lone_draft.MAX_STREAMS) queues no
cells for its streams' MTP heads (runner/lone.py): the copy and the host's loop over the
streams each call cost ~1% of a 64-stream pass on the H100 (6d6d6f4, nothing drafting), and
past 256 cells a stream an eager catch-up forward, for heads no drafted step of such a batch
reads. Those heads lag, and their streams draft no more in their reply; a smaller batch
queues as before. Replies do not change (drafts are verified)."""

import dataclasses

import torch

from flashlane.drafting.mtp import MtpDrafter
from flashlane.lanes.records import Draws
from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.request import SamplingParams
from flashlane.runner.lone import LoneDriver
from flashlane.runner.lone_draft import MAX_STREAMS
from tests.runner.test_exact import COSTS
from tests.runner.test_lone import lone_run, prefilled

GREEDY = SamplingParams(max_tokens=40, temperature=0.0)  # drafting (the default)


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(3, 500, (4 + 3 * i,), generator=g).tolist() for i in range(n)]


def test_a_batch_past_max_streams_queues_no_cells_and_drafts_no_more(tiny_ckpt):
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    ps = _prompts(MAX_STREAMS + 1)
    filled = [prefilled(model, cfg, p) for p in ps]
    drafter = MtpDrafter(model, confidence=0.0)
    driver = LoneDriver(model, [s for s, _ in filled], drafter=drafter)
    assert driver.most_drafted == MAX_STREAMS
    ids, firsts = list(range(len(ps))), [t for _, t in filled]
    starts = [len(p) for p in ps]
    draws = [Draws(GREEDY, 0, p, []) for p in ps]
    takes = [lambda t, f: True] * len(ps)
    sids = [100 + i for i in ids]
    n = driver.decode_many(ids, firsts, starts, 4, takes, sids, draws)
    assert n >= 4 and drafter.lagging == set(sids) and not drafter.waiting
    # no drafted call for a lagging stream, no cell queued from a shared round
    args = (ids[:2], firsts[:2], [s + n for s in starts[:2]], 4, 400, takes[:2], sids[:2])
    assert driver.decode_drafted(*args, draws[:2]) is None
    drafter.absorb_later(sids[0], torch.zeros(1, cfg.hc_count * cfg.hidden_size), [5], 6, draws[0])
    assert drafter.queued(sids[0]) == 0 and not drafter.waiting
    drafter.forget(sids[0])  # its reply ended: a new stream id starts afresh
    assert sids[0] not in drafter.lagging
    # MAX_STREAMS streams: their cells queue as before
    fresh = [200 + i for i in ids[:MAX_STREAMS]]
    pos = [s + n for s in starts[:MAX_STREAMS]]
    m = driver.decode_many(ids[:MAX_STREAMS], [5] * MAX_STREAMS, pos, 3, takes[:MAX_STREAMS],
                           fresh, draws[:MAX_STREAMS])  # fmt: skip
    assert m >= 3 and not drafter.lagging & set(fresh)
    assert all(drafter.queued(sid) == m for sid in fresh)


def test_replies_of_a_wide_lone_batch_drafting_equal_plain(tiny_ckpt):
    """Greedy replies of MAX_STREAMS + 2 streams on the lone driver, drafting on (their
    heads lag from the first call) and off, then the tail's."""
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=MAX_STREAMS + 2, max_rows=64)
    ps = _prompts(MAX_STREAMS + 2)
    params = [
        SamplingParams(max_tokens=12 + 5 * (i % 3), temperature=0.0, ignore_eos=True)
        for i in range(len(ps))
    ]
    drafter = llm.engine.backend.drafter
    lagged: list[int] = []
    lag = drafter.lag
    drafter.lag = lambda sids: (lagged.extend(sids), lag(sids))

    def replies(draft: bool) -> list[list[int]]:
        ask = [dataclasses.replace(p, draft=draft) for p in params]
        return [o.token_ids for o in llm.generate(ps, ask)]

    on, _ = lone_run(llm, lambda: replies(True), 8, len(ps), drafter)
    off, _ = lone_run(llm, lambda: replies(False), 8, len(ps), drafter)
    assert lagged and on == off


def test_prompts_ending_into_a_wide_lone_batch_queue_no_cells(tiny_ckpt):
    """Prompts that end in one round into a lone batch past MAX_STREAMS: their heads lag
    from that round (lanes/lone_turn.lag_heads), so the prompt round queues none of their cells
    (on the H100 the 64-prompt round's queueing was ~0.1% of a pass where nothing drafts);
    fewer prompts than that queue theirs as before. Replies equal drafting off."""
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=MAX_STREAMS + 2, max_rows=256)
    drafter = llm.engine.backend.drafter
    queued: list[int] = []
    absorb_later = drafter.absorb_later

    def counting(sid, *args):
        if sid not in drafter.lagging:
            queued.append(sid)
        absorb_later(sid, *args)

    drafter.absorb_later = counting
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)

    def replies(n: int, draft: bool) -> list[list[int]]:
        ask = dataclasses.replace(params, draft=draft)
        return [o.token_ids for o in llm.generate(_prompts(n), [ask] * n)]

    wide = MAX_STREAMS + 2
    on, _ = lone_run(llm, lambda: replies(wide, True), 8, wide, drafter)
    assert not queued
    off, _ = lone_run(llm, lambda: replies(wide, False), 8, wide, drafter)
    assert on == off
    lone_run(llm, lambda: replies(2, True), 8, wide, drafter)
    assert queued  # two prompts into a batch a drafted step takes: cells queue


def test_prompts_past_the_lone_calls_room_keep_their_cells(tiny_ckpt):
    """A lone call takes at most `lone_streams`: of MAX_STREAMS + 2 prompts ending together
    into a call of MAX_STREAMS + 1, the one left to shared rounds keeps its cells (it drafts
    there); the others lag."""
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=MAX_STREAMS + 2, max_rows=256)
    drafter = llm.engine.backend.drafter
    lagged: list[int] = []
    lag = drafter.lag
    drafter.lag = lambda sids: (lagged.extend(sids), lag(sids))
    n = MAX_STREAMS + 2
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    lone_run(llm, lambda: llm.generate(_prompts(n), [params] * n), 8, n - 1, drafter)
    assert len(set(lagged)) == n - 1
