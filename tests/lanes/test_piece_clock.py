"""Prompts in pieces beside decoders: the piece clock (the rows a round takes while replies
decode, from measured rounds) and the head's catch-up the depth rule prices."""

import types

import pytest

from flashlane.lanes import host as host_module
from flashlane.lanes.piece_clock import PieceClock
from flashlane.lanes.records import CHUNK
from flashlane.request import SamplingParams
from tests.lanes.fake import FakeBackend, hash_model, make_host, run_to_end, serial


def test_one_chunk_first_then_a_second_size_where_one_does_not_give_the_line():
    clock = PieceClock(2.5)
    assert clock.rows(1024) == CHUNK
    clock.record(0.5, 64)  # a piece round before any plain one: nothing to compare with
    assert clock.line() is None and clock.rows(1024) == 2 * CHUNK
    assert clock.rows(CHUNK) == CHUNK  # never past `most`
    clock.record(0.1, 0)  # now 64 rows are past the limit (0.25 s): still a second size
    assert clock.line() is None and clock.rows(1024) == 2 * CHUNK
    clock.record(0.1, 0)
    assert clock.rows(32) == 32


def test_pieces_fill_the_room_the_stall_leaves():
    clock = PieceClock(2.5)
    clock.record(0.1, 0)
    clock.record(0.1 + 64 * 0.0005, 64)  # 0.5 ms a row: room 0.15 s holds 300 rows
    assert clock.line() == pytest.approx((0.1, 0.0005))
    assert clock.rows(1024) == 256  # on the chunk grid
    assert clock.rows(128) == 128
    clock.record(0.1 + 256 * 0.0005, 256)  # a second size: the same line
    assert clock.line() == pytest.approx((0.1, 0.0005))
    assert clock.rows(1024) == 256


def test_slow_rows_keep_one_chunk():
    clock = PieceClock(2.5)
    clock.record(0.1, 0)
    clock.record(0.1 + 64 * 0.1, 64)  # past the limit at one chunk: a probe of two
    assert clock.rows(1024) == 128
    clock.record(0.1 + 128 * 0.1, 128)  # the line: 0.1 s a row, base the plain round's
    assert clock.line() == pytest.approx((0.1, 0.1))
    assert clock.rows(1024) == CHUNK


def test_a_round_that_costs_more_than_the_stall_at_any_size_takes_many_rows():
    """Lone decoders (20 ms a round) beside a shared round of 300 ms whatever its rows: the
    stall cannot hold, and one chunk a round would only make the prompts' rounds many. The
    line's base then sets the limit: stall x base, the rows fill the rest."""
    clock = PieceClock(2.5)
    clock.record(0.02, 0)
    clock.record(0.3 + 64 * 0.0001, 64)
    assert clock.rows(768) == 128  # past 2.5 x 20 ms at one chunk: a second size
    clock.record(0.3 + 128 * 0.0001, 128)
    base, per_row = clock.line()
    assert base == pytest.approx(0.3) and per_row == pytest.approx(0.0001)
    assert clock.rows(768) == 768  # 0.45 s of room above the base holds 4,500 rows
    assert clock.rows(4096) == 4096 // CHUNK * CHUNK
    assert PieceClock(2.5).rows(4096) == CHUNK


def test_averages_move_toward_new_measures():
    clock = PieceClock(2.5)
    clock.record(0.1, 0)
    clock.record(0.2, 0)
    assert 0.1 < clock.plain < 0.2


def test_a_stall_of_one_or_less_is_refused():
    with pytest.raises(ValueError, match="stall"):
        PieceClock(1.0)


class TimedBackend(FakeBackend):
    """A fake whose rounds take `base` seconds plus `per_row` a prompt row, on a fake clock."""

    def __init__(self, base: float, per_row: float, piece_base: float = 0.0, **kw):
        super().__init__(**kw)
        self.base, self.per_row, self.now = base, per_row, 0.0
        self.piece_base = piece_base  # seconds a round with prompt rows costs beyond `base`
        self.rounds: list[tuple[int, bool, float]] = []  # prompt rows, decoding, seconds

    def verify(self, windows):
        rows = sum(w.num_rows for w in windows if w.kind == "prompt")
        seconds = self.base + (self.piece_base if rows else 0.0) + self.per_row * rows
        self.now += seconds
        self.rounds.append((rows, any(w.kind == "decode" for w in windows), seconds))
        return FakeBackend.verify(self, windows)


def test_a_long_prompt_beside_decoders_keeps_their_rounds_within_the_stall(monkeypatch):
    backend = TimedBackend(base=0.01, per_row=0.0001)
    fake_time = types.SimpleNamespace(perf_counter=lambda: backend.now, monotonic=lambda: 0.0)
    monkeypatch.setattr(host_module, "time", fake_time)
    host = make_host(backend, prefill_rows=1024, decode_share=0.5, stall=2.5)
    long_prompt = list(range(10, 90)) * 25  # 2,000 tokens
    host.submit("short", [11, 12, 13], SamplingParams(max_tokens=400, temperature=0.0))
    for _ in range(5):  # the decoder's plain rounds first
        host.run_once()
    host.submit("long", long_prompt, SamplingParams(max_tokens=8, temperature=0.0))
    outs = run_to_end(host)
    beside = [(rows, s) for rows, decoding, s in backend.rounds if decoding and rows]
    # the first piece is one chunk; then 0.015 s of room at 0.1 ms a row: 128-row pieces
    assert beside[0][0] == CHUNK
    assert max(rows for rows, _ in beside) == 128 < 512
    assert all(s <= 2.5 * 0.01 for _, s in beside)
    assert outs["long"].token_ids == serial(hash_model, long_prompt, None, 8)


@pytest.mark.parametrize("plain_first", [True, False])
def test_prompts_beside_decoders_take_few_rounds_where_a_piece_round_costs_a_lot(
    monkeypatch, plain_first
):
    """A round with pieces costs 0.2 s more than one without, whatever its rows (the real
    model's shared round beside lone steps): the pieces grow to the most a round takes
    instead of one chunk a round, with decoders measured first or a burst of prompts
    (the first decodes while the others fill: no plain round to compare with)."""
    backend = TimedBackend(base=0.01, per_row=0.0001, piece_base=0.2)
    fake_time = types.SimpleNamespace(perf_counter=lambda: backend.now, monotonic=lambda: 0.0)
    monkeypatch.setattr(host_module, "time", fake_time)
    host = make_host(backend, prefill_rows=1024, stall=2.5)
    prompts = {f"p{i}": list(range(10 + i, 90 + i)) * 15 for i in range(4)}  # 1,200 each
    host.submit("short", [11, 12, 13], SamplingParams(max_tokens=400, temperature=0.0))
    if plain_first:
        for _ in range(5):
            host.run_once()
    for rid, ids in prompts.items():
        host.submit(rid, ids, SamplingParams(max_tokens=8, temperature=0.0))
    outs = run_to_end(host)
    beside = [rows for rows, decoding, _ in backend.rounds if decoding and rows]
    assert max(beside) == 768  # 1024 less the decoders' quarter
    assert len(beside) <= 10  # one chunk a round: 59 (a burst) or 75 rounds
    assert host.counts["piece_rows"] == sum(rows for rows, _, _ in backend.rounds)
    assert host.counts["rounds"] >= len(backend.rounds) and host.counts["lone_s"] == 0.0
    for rid, ids in prompts.items():
        assert outs[rid].token_ids == serial(hash_model, ids, None, 8)


def test_the_depth_rule_counts_only_the_last_pieces_cells_as_catch_up(monkeypatch):
    """A prompt cut in pieces has each piece's cells absorbed as it is kept (the backend's
    head: runner/backend.py): at the first draft only the last piece's cells and the row
    before it are left, not the whole prompt (which would price drafting out)."""
    from flashlane.lanes import core

    seen = []
    real = core.choose_depth
    monkeypatch.setattr(core, "choose_depth", lambda *a, **k: seen.append(a[3]) or real(*a, **k))
    host = make_host(FakeBackend(), prefill_rows=64, mtp_drafts=3)
    host.submit("long", list(range(10, 210)), SamplingParams(max_tokens=4, temperature=0.0))
    run_to_end(host)
    assert seen[0] == 200 - (192 - 1) - 2  # pieces of 64: the last starts at 192


def test_decoders_beside_pieces_get_their_share_of_the_time():
    """Lone decoders after a shared round with pieces: decode_share of the time (a quarter
    by default: a third of the round's), at least one step, at most lone_steps."""
    from flashlane.lanes.host import HostConfig
    from flashlane.lanes.lone_turn import beside_budget

    def host(step, **config):
        lone = types.SimpleNamespace(step_seconds=lambda n: step)
        return types.SimpleNamespace(config=HostConfig(**config), lone=lone)

    assert beside_budget(host(0.001), [], 0.030) == 10
    assert beside_budget(host(0.001, decode_share=0.5), [], 0.030) == 30
    assert beside_budget(host(0.050), [], 0.030) == 1
    assert beside_budget(host(0.0001), [], 0.030) == HostConfig().lone_steps
    assert beside_budget(host(None), [], 0.030) == 4  # not measured yet


def test_an_abort_lands_between_a_long_prompts_pieces():
    """A request cancelled while its prompt fills ends at the next round, with no reply and
    most of its prompt never run; the decoder beside it goes on undisturbed."""
    backend = TimedBackend(base=0.01, per_row=0.0001)
    host = make_host(backend, prefill_rows=128)
    host.submit("short", [11, 12, 13], SamplingParams(max_tokens=40, temperature=0.0))
    host.submit("long", list(range(10, 90)) * 25, SamplingParams(max_tokens=8, temperature=0.0))
    for _ in range(3):
        host.run_once()
    host.cancel("long")
    outs = run_to_end(host)
    fed = sum(rows for rows, _, _ in backend.rounds)
    assert outs["long"].finish_reason == "abort" and outs["long"].token_ids == []
    assert fed < 1000  # of the 2,000-token prompt: the pieces stopped at the cancel
    assert outs["short"].token_ids == serial(hash_model, [11, 12, 13], None, 40)
    assert host.sessions.num_free == len(host.sessions.capacities)
