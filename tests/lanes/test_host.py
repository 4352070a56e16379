"""The host: admission, prompt pieces, cancel and drop, errors; every session comes back free."""

import pytest

from flashlane.lanes.host import QueueFull
from flashlane.lanes.records import CHUNK, Window
from flashlane.request import SamplingParams
from tests.lanes.fake import FakeBackend, alone, hash_model, make_host, run_to_end, serial

GREEDY = SamplingParams(max_tokens=30, temperature=0.0)
LANES = {"mtp_drafts": 3, "copy_drafts": 8}


class PieceLog(FakeBackend):
    def verify(self, windows):
        self.pieces = [*getattr(self, "pieces", []), *(w for w in windows if w.kind == "prompt")]
        self.rounds = [*getattr(self, "rounds", []), list(windows)]
        return FakeBackend.verify(self, windows)


def test_prompt_pieces_sit_on_the_chunk_grid_and_replies_are_not_starved():
    backend = PieceLog()
    host = make_host(backend, prefill_rows=256, decode_share=0.5, **LANES)
    host.submit("short", [11, 12, 13], GREEDY)
    host.submit("long", list(range(10, 80)) * 10, GREEDY)  # 700 tokens
    outs = run_to_end(host)
    for w in backend.pieces:
        assert w.start % CHUNK == 0
        assert w.num_rows % CHUNK == 0 or w.last_piece
    # beside a decoding reply a round carries at most half the prompt rows
    beside = [r for r in backend.rounds if any(w.kind == "decode" for w in r)]
    assert all(sum(w.num_rows for w in r if w.kind == "prompt") <= 128 for r in beside)
    assert any(any(w.kind == "prompt" for w in r) for r in beside)
    assert outs["long"].token_ids == serial(hash_model, list(range(10, 80)) * 10, None, 30)


def test_requests_wait_for_a_session_and_the_queue_is_bounded():
    host = make_host(FakeBackend(), num_sessions=1, max_queue=2, **LANES)
    host.submit("a", [11], GREEDY)
    host.submit("b", [12], GREEDY)
    with pytest.raises(QueueFull):
        host.submit("c", [13], GREEDY)
    with pytest.raises(ValueError):
        host.submit("a", [11], GREEDY)
    with pytest.raises(ValueError):
        host.submit("d", [], GREEDY)
    outs = run_to_end(host)
    assert outs["b"].token_ids == serial(hash_model, [12], None, 30)
    assert host.sessions.num_free == 1


def test_cancel_frees_the_session_at_the_next_round():
    backend = FakeBackend()
    host = make_host(backend, num_sessions=1, **LANES)
    host.submit("a", [11, 12], SamplingParams(max_tokens=500, temperature=0.0))
    host.submit("b", [13, 14], GREEDY)
    seen = []
    for _ in range(3):
        seen += host.run_once()
    host.cancel("a")
    outs = run_to_end(host)
    assert outs["a"].finish_reason == "abort"
    assert 0 < len(outs["a"].token_ids) < 500
    assert outs["a"].token_ids == serial(hash_model, [11, 12], None, len(outs["a"].token_ids))
    assert outs["b"].token_ids == serial(hash_model, [13, 14], None, 30)
    assert [r[0] for r in backend.released] == [0, 1]
    assert host.sessions.num_free == 1 and not backend.session_of


def test_drop_delivers_nothing_more_and_frees_the_session():
    host = make_host(FakeBackend(), num_sessions=1, **LANES)
    host.submit("a", [11, 12], SamplingParams(max_tokens=500, temperature=0.0))
    host.submit("q", [11, 12], GREEDY)
    host.run_once()
    host.drop("a")
    host.drop("q")  # still waiting: leaves the queue
    assert run_to_end(host) == {}
    assert host.sessions.num_free == 1 and not host.waiting


def test_a_stream_error_ends_only_that_stream():
    backend = FakeBackend()
    host = make_host(backend, **LANES)
    host.submit("bad", [11, 12], GREEDY)
    host.submit("good", [13, 14], GREEDY)
    for _ in range(4):
        host.run_once()
    backend.fail_verdicts.add(0)
    outs = run_to_end(host)
    assert outs["bad"].finish_reason == "error" and "injected" in outs["bad"].error
    assert outs["good"].token_ids == alone({}, [13, 14], GREEDY, **LANES).token_ids
    assert host.sessions.num_free == 4 and not backend.session_of


def test_a_failed_draft_ends_only_its_stream():
    backend = FakeBackend()
    host = make_host(backend, copy_drafts=0, mtp_drafts=2)
    host.submit("bad", [11, 12], GREEDY)
    host.submit("good", [13, 14], GREEDY)
    host.run_once()
    backend.fail_drafts.add(0)
    outs = run_to_end(host)
    assert outs["bad"].finish_reason == "error"
    assert outs["good"].finish_reason == "length"
    assert host.sessions.num_free == 4


@pytest.mark.parametrize("call", ["verify", "keep", "draft"])
def test_a_whole_call_failure_ends_its_streams_and_the_engine_goes_on(call):
    backend = FakeBackend()
    host = make_host(backend, copy_drafts=0, mtp_drafts=2)
    host.submit("a", [11, 12], GREEDY)
    host.submit("b", [13, 14], GREEDY)
    for _ in range(3):
        host.run_once()
    backend.fail_next = call
    outs = run_to_end(host)
    assert {o.finish_reason for o in outs.values()} == {"error"}
    assert all(call in o.error for o in outs.values())
    assert host.sessions.num_free == 4 and not backend.session_of
    assert all(keep is False for _, keep in backend.released)
    host.submit("next", [11, 12], GREEDY)
    assert run_to_end(host)["next"].token_ids == serial(hash_model, [11, 12], None, 30)


def test_fail_all_ends_the_named_streams():
    host = make_host(FakeBackend(), **LANES)
    host.submit("a", [11, 12], GREEDY)
    host.submit("b", [13, 14], GREEDY)
    host.run_once()
    host.fail_all([0], "the device fell over")
    outs = run_to_end(host)
    assert outs["a"].error == "the device fell over"
    assert outs["b"].finish_reason == "length"
    assert host.sessions.num_free == 4


def test_streaming_updates_add_up_to_the_reply_and_carry_logprobs():
    host = make_host(FakeBackend(), **LANES)
    params = SamplingParams(max_tokens=30, temperature=0.0, logprobs=1)
    host.submit("a", [11, 12], params)
    streamed, finals = [], []
    while host.has_work:
        for update in host.run_once():
            streamed += update.token_ids
            finals.append(update.finish)
    assert streamed == serial(hash_model, [11, 12], None, 30)
    assert finals[-1] == "length" and finals.count("length") == 1
    out = run_to_end(host)
    assert out == {}


def test_a_stream_short_of_room_moves_to_a_larger_session():
    backend = FakeBackend(capacities=(48, 256))
    host = make_host(backend, num_sessions=2, grow=16, **LANES)
    params = SamplingParams(max_tokens=100, temperature=0.0)
    host.submit("a", [11, 12], params)
    out = run_to_end(host)["a"]
    assert out.token_ids == serial(hash_model, [11, 12], None, 100)
    assert out.stats.moves == 1 and host.sessions.num_free == 2


def _window_ids(windows: list[Window]) -> list[int]:
    return [w.stream_id for w in windows]


def test_a_handed_off_reply_continues_as_if_the_lanes_had_made_it():
    prompt = [11, 12, 13]
    full = serial(hash_model, prompt, None, 30)
    backend = FakeBackend()
    host = make_host(backend, **LANES)
    s = host.hand_off("lone", prompt, GREEDY, 0, session_id=2, reply_ids=full[:9])
    backend.fed[s.stream_id] = prompt + full[:8]
    backend.session_of[s.stream_id] = 2
    host.submit("other", [14, 15], GREEDY)
    streamed = []
    while host.has_work:
        streamed += [t for u in host.run_once() if u.stream is s for t in u.token_ids]
    assert streamed == full[9:]
    assert host.sessions.num_free == 4
