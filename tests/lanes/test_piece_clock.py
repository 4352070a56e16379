"""Prompts in pieces beside decoders: the piece clock (the rows a round takes while replies
decode, from measured rounds) and the head's catch-up the depth rule prices."""

import types

import pytest

from flashlane.lanes import host as host_module
from flashlane.lanes.piece_clock import PieceClock
from flashlane.lanes.records import CHUNK
from flashlane.request import SamplingParams
from tests.lanes.fake import FakeBackend, hash_model, make_host, run_to_end, serial


def test_one_chunk_until_both_figures_are_measured():
    clock = PieceClock(2.5)
    assert clock.rows(1024) == CHUNK
    clock.record(0.5, 64)  # a piece round before any plain one: nothing to subtract from
    assert clock.per_row is None and clock.rows(1024) == CHUNK
    clock.record(0.1, 0)
    assert clock.rows(1024) == CHUNK and clock.rows(32) == 32


def test_pieces_fill_the_room_the_stall_leaves():
    clock = PieceClock(2.5)
    clock.record(0.1, 0)
    clock.record(0.1 + 64 * 0.0005, 64)  # 0.5 ms a row: room 0.15 s holds 300 rows
    assert clock.per_row == pytest.approx(0.0005)
    assert clock.rows(1024) == 256  # on the chunk grid
    assert clock.rows(128) == 128
    clock.record(0.1 + 64 * 0.1, 64)  # slow rows: never below one chunk
    assert clock.rows(1024) == CHUNK


def test_a_whole_lone_call_stands_in_for_single_steps():
    """Decoders on the lone driver, interrupted by arrivals, measure plain rounds of one step
    (7 ms), and a shared round with any piece costs 300 ms: against the steps every piece
    round is past the stall (one chunk a round); against a whole call of 32 steps (the
    host's `plain`) the pieces take the most a round holds."""
    alone = PieceClock(2.5)
    alone.record(0.007, 0)
    alone.record(0.3 + 64 * 0.0001, 64)
    assert alone.rows(768) == CHUNK
    clock = PieceClock(2.5)
    clock.record(0.007, 0)
    assert clock.baseline(0.64) == 0.64 and clock.baseline(0.001) == 0.007
    assert clock.rows(768, 0.64) == CHUNK  # no piece round measured yet
    clock.record(0.3 + 64 * 0.0001, 64, 0.64)
    assert clock.per_row == 0.0 and clock.rows(768, 0.64) == 768
    # a piece round past the call: rows by what it added
    clock.record(0.64 + 5.0, 768, 0.64)
    assert clock.rows(768, 0.64) < 768


def test_the_host_prices_a_whole_lone_call():
    host = make_host(FakeBackend())
    assert host._lone_call([]) is None  # no lone driver
    host.lone = types.SimpleNamespace(step_seconds=lambda n: None)
    assert host._lone_call([object()]) is None  # not measured yet
    host.lone = types.SimpleNamespace(step_seconds=lambda n: 0.002 * n)
    assert host._lone_call([object(), object()]) == pytest.approx(0.004 * 32)
    assert host._lone_call([]) is None


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

    def __init__(self, base: float, per_row: float, **kw):
        super().__init__(**kw)
        self.base, self.per_row, self.now = base, per_row, 0.0
        self.rounds: list[tuple[int, bool, float]] = []  # prompt rows, decoding, seconds

    def verify(self, windows):
        rows = sum(w.num_rows for w in windows if w.kind == "prompt")
        seconds = self.base + self.per_row * rows
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


@pytest.mark.parametrize("steps,want", [(3, 3), (None, 32), (50, 40)])
def test_drafted_decoders_beside_pieces_keep_their_share(steps, want):
    """run_lone's steps (beside_budget's share) bound a drafted call as a plain one: a
    drafted lone call beside a round's prompt pieces ran lone_steps (32) at 63de559. No
    more than the reply's tokens left (40) either, which the call is told (one each)."""
    from flashlane.lanes.host import HostConfig
    from flashlane.lanes.lone_turn import run_lone
    from flashlane.lanes.records import Draws

    calls = []

    def decode_drafted(ids, tokens, starts, budget, *rest, hints, left, ends):
        calls.append((budget, left))
        return [2], [0]

    lone = types.SimpleNamespace(decode_drafted=decode_drafted, most_drafted=16)
    host = types.SimpleNamespace(config=HostConfig(), lone=lone)
    params = SamplingParams(max_tokens=48, temperature=0.0)
    stream = types.SimpleNamespace(
        params=params, reply_ids=[5] * 8, room=1000, held=None, seed=0, start=20,
        draws=Draws(params, 0, [1, 2], []), copy_index=None, session_id=0, stream_id=0,
        num_drafted=0, num_accepted=0,
    )  # fmt: skip
    run_lone(host, [stream], steps)
    assert calls == [(want, [40])]


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
