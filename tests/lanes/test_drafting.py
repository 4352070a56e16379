"""Copy drafts, priced allocation and the depth rule."""

import dataclasses
import itertools

import torch

from flashlane.lanes.allocate import allocate
from flashlane.lanes.copy_drafts import CopyIndex
from flashlane.lanes.depth import (
    PROBE_EVERY,
    PROBE_IDLE_EVERY,
    best_depth,
    choose_depth,
    round_prices,
)
from flashlane.lanes.records import CostTable
from flashlane.lanes.stream import DraftStats, Held, Stream
from flashlane.lanes.windows import plan, take_turns
from flashlane.request import SamplingParams
from tests.lanes.fake import FakeBackend, alone, copy_model, make_host, run_to_end, serial

GREEDY = SamplingParams(max_tokens=60, temperature=0.0)
# A row costs 3 ms on a 10 ms forward: a draft pays only when it lands often enough.
STEEP = CostTable({n: 10.0 + 3.0 * (n - 1) for n in range(1, 65)}, 0.5, 1.0)


def test_copy_index_proposes_the_longest_recent_match():
    index = CopyIndex([1, 2, 3, 4, 9, 2, 3, 4, 5, 7, 1, 2, 3, 4])
    # "2 3 4" occurs twice before; "1 2 3 4" only at the start, so its continuation wins
    assert index.propose(3) == [9, 2, 3]
    index.extend([8])
    assert index.propose(2) == []


def test_copy_index_runs_past_the_end_of_a_periodic_context():
    index = CopyIndex([5, 6, 7, 5, 6, 7, 5])
    assert index.propose(5) == [6, 7, 5, 6, 7]
    assert CopyIndex([1, 2]).propose(4) == []


def test_copy_index_proposes_as_if_indexed_token_by_token():
    """The index keys its grams when asked to propose (extend only appends: every token of
    every reply goes through it, drafting or not); proposals between any extends equal a
    brute-force search of the most recent longest match."""
    from flashlane.lanes.copy_drafts import MAX_MATCH, MIN_MATCH, RECENT

    def brute(ids, k):
        n, best, best_len = len(ids), -1, 0
        starts = [e for e in range(MIN_MATCH, n) if ids[e - MIN_MATCH : e] == ids[n - MIN_MATCH :]]
        for end in starts[-RECENT:][::-1]:
            length = 0
            while length < min(MAX_MATCH, end) and ids[end - 1 - length] == ids[n - 1 - length]:
                length += 1
            if length > best_len:
                best, best_len = end, length
        out = []
        for i in range(k):
            out.append(ids[best + i] if best + i < n else out[best + i - n])
        return out if best_len and n >= MIN_MATCH else []

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 5, (300,), generator=g).tolist()
    # a stream's index reads its reply list itself (host.py): nothing goes through extend
    reply: list[int] = []
    index, read, seen = CopyIndex(ids[:10]), CopyIndex(ids[:10], reply), ids[:10]
    at = 10
    while at < len(ids):
        step = int(torch.randint(1, 9, (1,), generator=g))
        index.extend(ids[at : at + step])
        reply.extend(ids[at : at + step])
        seen, at = ids[: at + step], at + step
        assert index.propose(6) == read.propose(6) == brute(seen, 6)


def test_copy_drafts_land_on_a_repetitive_prompt():
    prompt = [20, 21, 22, 23, 24, 25, 26, 27] * 6
    out = alone({"model": copy_model}, prompt, GREEDY, mtp_drafts=0, copy_drafts=8)
    assert out.token_ids == serial(copy_model, prompt, None, 60)
    assert out.stats.accepted >= 40
    assert out.stats.rounds < 20


def test_mtp_drafts_are_proposed_and_verified():
    out = alone({}, [11, 12, 13], GREEDY, mtp_drafts=3, copy_drafts=0)
    assert out.stats.drafted > 0 and out.stats.accepted > 0


def _stream(
    stream_id: int, drafts: int, prior: float, misses: int = 0, num_reply: int = 1
) -> Stream:
    s = Stream(stream_id, f"r{stream_id}", [10, 11], GREEDY, 0, stream_id, 4096, stream_id)
    s.filled = 2
    s.reply_ids.extend(range(12, 12 + num_reply))
    s.held = Held("mtp", s.start, tuple(range(20, 20 + drafts)), (prior,) * drafts)
    for _ in range(misses):
        s.mtp.record([prior], 0)
    return s


def test_first_draft_is_taken_while_unmeasured_where_a_sure_landing_pays():
    # however unlikely its prior: the draft is there to measure the stream
    plans = [plan(_stream(0, 3, 0.05))]
    assert allocate(plans, STEEP, max_rows=16) == [1]
    # not where even a draft that lands would not pay for its row (a round full of rows)
    dear = CostTable({1: 10.0, 2: 500.0, 3: 1000.0}, 100.0, 1.0)
    assert allocate(plans, dear, max_rows=16) == [0]


def test_drafts_that_never_land_are_not_taken_once_measured():
    fresh, failing = _stream(0, 3, 0.9), _stream(1, 3, 0.9, misses=6)
    counts = allocate([plan(fresh), plan(failing)], STEEP, max_rows=16)
    assert counts[0] >= 1 and counts[1] == 0
    # unpriced, every draft goes in while rows remain
    assert allocate([plan(fresh), plan(failing)], None, max_rows=16) == [3, 3]
    assert allocate([plan(fresh), plan(failing)], None, max_rows=4) in ([2, 0], [1, 1])


def test_priced_drafts_stop_where_tokens_per_ms_stops_rising():
    # the unlikely stream is ahead: a draft of its own would not even the batch's slowest
    likely, unlikely = _stream(0, 4, 0.95), _stream(1, 4, 0.2, num_reply=3)
    for s in (likely, unlikely):
        s.mtp.record([s.held.priors[0]] * 2, 1)
    counts = allocate([plan(likely), plan(unlikely)], STEEP, max_rows=16)
    assert counts[0] > counts[1] == 0
    # a prompt piece in the same forward makes rows no dearer per row here, but shares it
    assert allocate([plan(likely)], STEEP, max_rows=16, num_prompt_rows=64)[0] >= 1
    assert sum(allocate([plan(likely), plan(unlikely)], STEEP, max_rows=3)) <= 1


def test_a_stream_whose_drafts_never_land_stops_drafting():
    backend = FakeBackend(wrong=lambda stream_id, call: 0, cost_table=STEEP)
    host = make_host(backend, mtp_drafts=3, copy_drafts=0)
    host.submit("r", [11, 12, 13], SamplingParams(max_tokens=120, temperature=0.0))
    out = run_to_end(host)["r"]
    assert out.stats.accepted == 0
    assert 1 <= out.stats.drafted <= 12
    assert sum(1 for w in backend.widths if w and w[0] > 1) == out.stats.drafted


def test_depth_rule_picks_best_tokens_per_ms_and_probes_deeper():
    prices = round_prices(CostTable({n: 10.0 + 0.5 * n for n in range(1, 17)}, 0.2, 1.0), 3)
    good, bad = DraftStats(), DraftStats()
    for _ in range(30):
        good.record([0.9, 0.9, 0.9], 3)
        bad.record([0.9], 0)
    assert best_depth(good, prices) == 3
    assert best_depth(good, prices, max_depth=2) == 2
    assert best_depth(bad, prices) == 0
    assert choose_depth(bad, prices, num_rounds=0) == 0
    # a stream that drafts nothing probes, but seldom: each probe is a draft call of its own
    assert choose_depth(bad, prices, num_rounds=PROBE_EVERY - 1) == 0
    assert choose_depth(bad, prices, num_rounds=PROBE_IDLE_EVERY - 1) == 1
    assert choose_depth(good, prices, num_rounds=PROBE_EVERY - 1) == 3
    assert best_depth(DraftStats(), prices) >= 1  # unmeasured: reach for depth


def test_a_head_catches_up_only_where_good_drafts_would_repay_it_in_the_rounds_left():
    poor = DraftStats()
    for _ in range(30):
        poor.record([0.9], 0)
    probe = PROBE_IDLE_EVERY - 1
    # four streams, sixteen rows: drafts that land as good drafts do would pay (2.5 ms more a
    # round for 3.6 tokens more), so an idle stream probes every PROBE_IDLE_EVERY rounds ...
    costs = CostTable({n: 10.0 + 0.5 * n for n in range(1, 17)}, 0.5, 1.0, absorb_cell_ms=0.1)
    four = round_prices(costs, 3, round_rows=4, max_rows=16)
    assert best_depth(poor, four) == 0
    assert choose_depth(poor, four, probe, catch_up_cells=2) == 1
    # ... unless half of what they would save (4.8 ms a round: 77 ms in PROBE_IDLE_EVERY
    # rounds, 29 in twelve, 15 in six) does not repay its head's catch-up (0.4 ms a cell for
    # the four streams: 16 ms for 40 cells) and the dearer round (2.5 ms)
    assert choose_depth(poor, four, probe, catch_up_cells=400) == 0
    assert choose_depth(poor, four, probe, catch_up_cells=40) == 1
    assert choose_depth(poor, four, probe, catch_up_cells=40, rounds_left=12) == 1
    assert choose_depth(poor, four, probe, catch_up_cells=40, rounds_left=6) == 0
    # or where the engine's heads so far make good drafts unlikely
    assert choose_depth(poor, four, probe, catch_up_cells=40, odds=0.1) == 0
    # a fresh stream pays for its prompt's cells the same way before its first draft
    fresh = DraftStats()
    assert choose_depth(fresh, four, 0, catch_up_cells=100) >= 1
    assert choose_depth(fresh, four, 0, catch_up_cells=1000) == 0
    assert choose_depth(fresh, four, 0, catch_up_cells=100, odds=0.05) == 0
    # a stream that drafts pays its head's absorb every round: nothing to catch up
    good = DraftStats()
    for _ in range(30):
        good.record([0.9, 0.9, 0.9], 3)
    assert choose_depth(good, round_prices(costs, 2), PROBE_EVERY - 1, catch_up_cells=400) == 2
    # eight streams: sixteen rows cost 1.95 times eight, so only drafts that always land pay;
    # no probe
    full = round_prices(CostTable({1: 10.0, 8: 20.0, 16: 38.5}, 0.5, 0.0), 3, 8, 16)
    assert choose_depth(poor, full, probe) == 0
    # where good drafts would pay a little, only a reply with long to go repays the probe
    cheaper = round_prices(CostTable({1: 10.0, 8: 20.0, 16: 36.0}, 0.5, 0.0), 3, 8, 16)
    assert choose_depth(poor, cheaper, probe, catch_up_cells=10, rounds_left=1000) == 1
    assert choose_depth(poor, cheaper, probe, catch_up_cells=10) == 0


def test_the_core_counts_the_cells_a_head_absorbs_at_each_draft_call():
    backend = FakeBackend()
    host = make_host(backend, mtp_drafts=2, copy_drafts=0)
    seen: list[tuple[int, int, int]] = []  # (start before the call, absorbed before, after)
    draft = backend.draft

    def watched(depths):
        s = next(s for s in host.live if s.stream_id in depths)
        seen.append((s.start, before.get(s.stream_id, 0), s.absorbed))
        return draft(depths)

    backend.draft = watched
    host.submit("r", [11, 12, 13], SamplingParams(max_tokens=30, temperature=0.0))
    for _ in range(100):
        if not host.has_work:
            break
        before = {s.stream_id: s.absorbed for s in host.live}
        host.run_once()
    # the first call absorbs the whole context; each call after it the cells kept since the
    # last one; after a call the head holds every cell before the pending token
    assert seen and seen[0][1] == 0
    assert all(after == start for start, _, after in seen)
    assert all(b == a for (_, _, a), (_, b, _) in itertools.pairwise(seen))


def test_turns_go_to_the_least_recently_served_within_the_caps():
    streams = [_stream(i, 0, 0.5) for i in range(5)]
    for s, served in zip(streams, [3, 1, 2, 0, 1]):
        s.last_served = served
    assert [s.stream_id for s in take_turns(streams, 3, 16)] == [3, 1, 4]
    assert [s.stream_id for s in take_turns(streams, 16, 2)] == [3, 1]


def test_row_cap_shares_rounds_fairly():
    backend = FakeBackend()
    host = make_host(backend, num_sessions=5, max_rows=2, mtp_drafts=3)
    for i in range(5):
        host.submit(f"r{i}", [11 + i, 12], SamplingParams(max_tokens=10, temperature=0.0))
    outs = run_to_end(host)
    assert all(sum(w) <= 2 for w in backend.widths)
    assert all(len(o.token_ids) == 10 for o in outs.values())
    rounds = [o.stats.rounds for o in outs.values()]
    assert max(rounds) - min(rounds) <= 9


def test_a_head_whose_unsure_drafts_missed_is_not_caught_up_for_later_streams():
    # a 40-token prompt's catch-up costs 19 ms: worth it at even odds, not at a few percent
    costs = dataclasses.replace(STEEP, absorb_cell_ms=0.5)
    prompt = list(range(20, 60))
    for prob, later_drafts in ((0.03, False), (0.9, True)):
        backend = FakeBackend(wrong=lambda stream_id, call: 0, draft_prob=prob, cost_table=costs)
        host = make_host(backend, mtp_drafts=1, copy_drafts=0)
        host.submit("a", prompt, GREEDY)
        first = run_to_end(host)["a"]
        host.submit("b", prompt, GREEDY)
        second = run_to_end(host)["b"]
        assert first.stats.drafted >= 1 and first.stats.accepted == 0
        # the first stream's miss of a draft its head gave 3% makes a landing unlikely; a head
        # that was sure and missed once may still be good
        assert (second.stats.drafted > 0) == later_drafts
