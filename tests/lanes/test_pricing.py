"""Drafts priced by the round's shape: window widths, drafting streams, streams ahead."""

from flashlane.lanes.allocate import allocate
from flashlane.lanes.depth import PROBE_EVERY, best_depth, choose_depth, round_prices
from flashlane.lanes.records import CostTable
from flashlane.lanes.stream import DraftStats, Held, Stream
from flashlane.lanes.windows import plan
from flashlane.request import SamplingParams
from tests.lanes.fake import FakeBackend, make_host, run_to_end

GREEDY = SamplingParams(max_tokens=60, temperature=0.0)


def _costs(group_ms: float = 0.0, stream_ms: float = 0.0, row_ms: float = 0.5) -> CostTable:
    return CostTable(
        {n: 10.0 + row_ms * n for n in range(1, 33)},
        draft_step_ms=0.5,
        overhead_ms=1.0,
        group_ms=group_ms,
        draft_stream_ms=stream_ms,
    )


def _stream(
    stream_id: int, drafts: int, prior: float, num_reply: int = 1, hits: int = 10
) -> Stream:
    """A decoding stream holding `drafts` MTP drafts, `num_reply` tokens into its reply, whose
    drafts landed `hits` times of 20."""
    s = Stream(stream_id, f"r{stream_id}", [10, 11], GREEDY, 0, stream_id, 4096, stream_id)
    s.filled = 2
    s.reply_ids.extend(range(12, 12 + num_reply))
    s.held = Held("mtp", s.start, tuple(range(20, 20 + drafts)), (prior,) * drafts)
    for i in range(20):
        s.mtp.record([prior], int(i < hits))
    return s


def test_a_round_is_priced_by_its_rows_and_its_window_widths():
    costs = _costs(group_ms=3.0)
    assert costs.shape_ms(5) == costs.forward_ms(5) == 12.5
    assert costs.shape_ms(5, 2) == 15.5
    assert costs.shape_ms(7, 3) == 19.5
    assert _costs(stream_ms=0.25).chain_ms(2, 5) == 2 * (0.5 + 4 * 0.25)


def test_a_lone_draft_that_splits_the_round_is_refused_when_the_split_costs_more():
    plans = [plan(_stream(0, 1, 0.7))] + [plan(_stream(i, 0, 0.7)) for i in range(1, 4)]
    # 0.7 tokens for a row of 0.5 ms: it pays on rows alone ...
    assert allocate(plans, _costs(), max_rows=16) == [1, 0, 0, 0]
    # ... not once the round runs two stacked calls, one per window width
    assert allocate(plans, _costs(group_ms=3.0), max_rows=16) == [0, 0, 0, 0]


def test_drafts_in_every_window_keep_one_width_and_are_taken_where_a_lone_one_is_not():
    costs = _costs(group_ms=3.0)
    plans = [plan(_stream(i, 1, 0.7)) for i in range(4)]
    assert allocate(plans, costs, max_rows=16) == [1, 1, 1, 1]
    # the row cap leaves room for two of them: then the split is paid and not worth it
    assert allocate(plans, costs, max_rows=6) == [0, 0, 0, 0]
    assert allocate(plans, _costs(), max_rows=6) in ([1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 0])


def test_a_wider_window_pays_for_the_width_only_where_its_drafts_land():
    costs = _costs(group_ms=2.0, row_ms=3.0)
    likely = [plan(_stream(i, 3, 0.95)) for i in range(2)]
    unlikely = [plan(_stream(i, 3, 0.3, hits=2)) for i in range(2)]
    deep = allocate(likely, costs, max_rows=16)
    assert deep[0] == deep[1] >= 2
    assert allocate(unlikely, costs, max_rows=16) == [0, 0]


def test_drafts_of_a_stream_ahead_of_a_plain_one_count_only_the_row_they_spare():
    costs = _costs()
    even = [plan(_stream(0, 1, 0.6, num_reply=5)), plan(_stream(1, 0, 0.6, num_reply=5))]
    assert allocate(even, costs, max_rows=16) == [1, 0]
    # the plain stream is behind: the batch waits for it, the draft shortens no round
    ahead = [plan(_stream(0, 1, 0.6, num_reply=9)), plan(_stream(1, 0, 0.6, num_reply=5))]
    assert allocate(ahead, costs, max_rows=16) == [0, 0]
    # once the stream behind drafts too, both drafts are worth their tokens again
    both = [plan(_stream(0, 1, 0.6, num_reply=9)), plan(_stream(1, 1, 0.6, num_reply=5))]
    assert allocate(both, costs, max_rows=16) == [1, 1]


def test_depth_rule_prices_a_round_of_streams_drafting_alike():
    good = DraftStats()
    for _ in range(30):
        good.record([0.9, 0.9, 0.9], 3)
    # eight streams, twenty rows: each can carry one draft, all in windows of one width; two
    # each fit six of them, the other two windows a second stacked call
    assert best_depth(good, round_prices(_costs(), 3, 8, 20)) == 2
    assert best_depth(good, round_prices(_costs(group_ms=40.0), 3, 8, 20)) == 1
    # chain steps grow with the streams that draft: dear enough, none pays
    assert best_depth(good, round_prices(_costs(stream_ms=5.0), 3, 8, 16)) == 0
    assert best_depth(good, round_prices(_costs(stream_ms=5.0), 3, 1, 16)) == 3


def test_no_drafts_past_the_last_token_of_a_reply():
    backend = FakeBackend()
    asked: list[int] = []
    draft = backend.draft
    backend.draft = lambda depths: asked.extend(depths.values()) or draft(depths)
    host = make_host(backend, mtp_drafts=3, copy_drafts=0, unpriced=True)
    host.submit("short", [11, 12, 13], SamplingParams(max_tokens=2, temperature=0.0))
    assert len(run_to_end(host)["short"].token_ids) == 2
    assert asked == []  # the first token leaves one to draw: the bonus draw is it
    host.submit("four", [11, 12, 13], SamplingParams(max_tokens=4, temperature=0.0))
    assert len(run_to_end(host)["four"].token_ids) == 4
    assert asked and max(asked) <= 2


def test_a_draft_of_one_of_many_tied_streams_counts_only_its_share_of_the_batch():
    # a draft's row and window width cost 1.5 ms where a round of eight takes 2.4 ms a token
    costs = _costs(group_ms=0.5, row_ms=1.0)
    lone = [plan(_stream(0, 1, 0.9, hits=19))]
    tied = lone + [plan(_stream(i, 0, 0.9)) for i in range(1, 8)]
    # eight streams at one length: the batch ends when each has gained, one drafting moves it
    # an eighth of the way
    assert allocate(tied, costs, max_rows=16) == [0] * 8
    # the same draft of the only stream furthest behind moves the batch's end: taken
    ahead = lone + [plan(_stream(i, 0, 0.9, num_reply=3)) for i in range(1, 8)]
    assert allocate(ahead, costs, max_rows=16) == [1] + [0] * 7
    # every tied stream drafting: all count in full again
    every = [plan(_stream(i, 1, 0.9, hits=19)) for i in range(8)]
    assert allocate(every, costs, max_rows=16) == [1] * 8


def test_an_unmeasured_first_draft_is_taken_only_where_a_sure_landing_pays():
    fresh = _stream(0, 1, 0.5)
    fresh.mtp = DraftStats()  # no acceptance measured yet
    plain = [plan(_stream(i, 0, 0.5)) for i in range(1, 8)]
    # two streams: a row of 0.5 ms against 6 ms a token, taken to measure the stream
    assert allocate([plan(fresh), plain[0]], _costs(group_ms=1.0), max_rows=16) == [1, 0]
    # eight: the row and the second window width (4.5 ms) cost more than a token (1.9 ms)
    assert allocate([plan(fresh), *plain], _costs(group_ms=4.0), max_rows=16) == [0] * 8


def test_a_stream_whose_drafts_were_refused_drafts_again_only_when_it_probes():
    good = DraftStats()
    for _ in range(30):
        good.record([0.9, 0.9, 0.9], 3)
    prices = round_prices(_costs(), 3)
    assert choose_depth(good, prices, num_rounds=0) == 3
    assert choose_depth(good, prices, num_rounds=0, is_refused=True) == 0
    assert choose_depth(good, round_prices(_costs(), 2), PROBE_EVERY - 1, is_refused=True) == 2
