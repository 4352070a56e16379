"""slots: parsing the session list and margin, admission, and the room verdict before a round."""

from __future__ import annotations

import random

import pytest

from flashlane.sessions.slots import (
    DEFAULT_GROW,
    MAX_TOKENS,
    Demand,
    NoSessionFits,
    choose_session,
    format_slot_contexts,
    parse_slot_contexts,
    parse_slot_grow,
    reply_end,
    room,
    rooms,
)

SEED_LIST = "65536,32768x3,16384x11"


def test_parse_the_seed_list() -> None:
    sessions = parse_slot_contexts(SEED_LIST)
    assert sessions == (65536,) + (32768,) * 3 + (16384,) * 11
    assert len(sessions) == 15
    assert format_slot_contexts(sessions) == SEED_LIST


@pytest.mark.parametrize("text", [" 65536 , 32768 x 3,16384X11 ", "65536,\t32768x 3, 16384 x11"])
def test_parse_tolerates_spaces(text: str) -> None:
    assert parse_slot_contexts(text) == parse_slot_contexts(SEED_LIST)


@pytest.mark.parametrize(
    "text",
    ["", "  ", "abc", "65536,", ",65536", "x3", "3x", "65536;1024", "1.5", "-5", "64k",
     "1024x3x2", "1024*3", "1 024", "\u0663"],
)  # fmt: skip
def test_parse_refuses_bad_syntax(text: str) -> None:
    with pytest.raises(ValueError, match="slot-contexts"):
        parse_slot_contexts(text)


@pytest.mark.parametrize("text", ["1024x0", "0", "0x3", "1024,0x2"])
def test_parse_refuses_zero(text: str) -> None:
    with pytest.raises(ValueError, match="0"):
        parse_slot_contexts(text)


@pytest.mark.parametrize(
    "text", [str(2**31), "9" * 30, "1" + "0" * 5000, f"1024x{2**31}", f"1024x{'9' * 40}"]
)
def test_parse_refuses_overflow(text: str) -> None:
    with pytest.raises(ValueError, match="overflows"):
        parse_slot_contexts(text)


def test_parse_largest_counts_pass() -> None:
    assert parse_slot_contexts(str(MAX_TOKENS)) == (MAX_TOKENS,)


def test_parse_refuses_too_many_sessions() -> None:
    assert len(parse_slot_contexts("1024x64")) == 64
    with pytest.raises(ValueError, match="more than 64 sessions"):
        parse_slot_contexts("1024x65")
    with pytest.raises(ValueError, match="more than 16 sessions"):
        parse_slot_contexts(SEED_LIST + ",8192x2", max_sessions=16)
    # A huge repeat is refused before anything is built for it.
    with pytest.raises(ValueError, match="2000000000 with 60 left"):
        parse_slot_contexts("4096x4,1024x2000000000")
    assert len(parse_slot_contexts(SEED_LIST + ",8192", max_sessions=16)) == 16


def test_parse_slot_grow() -> None:
    assert parse_slot_grow(None) == DEFAULT_GROW == 8192
    assert parse_slot_grow(" 4096 ") == 4096
    assert parse_slot_grow(2048) == 2048
    for bad in ["", "0", "-1", "abc", "1e4", str(2**31), "9" * 50, 0, True]:
        with pytest.raises(ValueError, match="slot-grow"):
            parse_slot_grow(bad)


# Sessions for choice tests: ids 0..4.
CAPS = (64, 32, 32, 16, 16)


def test_admission_takes_the_smallest_free_that_holds_prompt_and_margin() -> None:
    free = set(range(len(CAPS)))
    # prompt 4 + margin 8 = 12 -> the first 16-token session (lower id on ties)
    assert choose_session(CAPS, free, prompt_len=4, max_tokens=100, window_rows=4, grow=8) == 3
    assert choose_session(CAPS, {1, 2, 4}, 4, 100, 4, 8) == 4
    assert choose_session(CAPS, {0, 2}, 4, 100, 4, 8) == 2
    # prompt 20 + margin 8 = 28 -> 32
    assert choose_session(CAPS, free, 20, 100, 4, 8) == 1
    # a short reply needs only prompt + max_tokens + a window
    assert choose_session(CAPS, free, 20, 2, 4, 8) == 1
    assert choose_session(CAPS, free, 8, 2, 4, 8) == 3
    # nothing free that holds it: wait
    assert choose_session(CAPS, {3, 4}, 20, 100, 4, 8) is None
    assert choose_session(CAPS, set(), 4, 100, 4, 8) is None


def test_admission_refuses_what_no_session_could_hold() -> None:
    with pytest.raises(NoSessionFits, match="largest session holds 64"):
        choose_session(CAPS, set(range(5)), prompt_len=60, max_tokens=100, window_rows=4, grow=8)
    # the same prompt with a reply short enough for the largest session is admitted
    assert choose_session(CAPS, set(range(5)), 60, 0, 4, 8) == 0


def _demand(session_id: int, committed: int, prompt: int = 4, max_tokens: int = 100) -> Demand:
    return Demand(session_id, committed, prompt, max_tokens, window_rows=4)


def test_a_session_that_holds_the_reply_never_moves_or_pauses() -> None:
    # prompt 10 + max_tokens 22 + window 4 = 36 fits session 0 (64) exactly at 36 too.
    caps = (36, 16, 64)
    rng = random.Random(7)
    for sid in (0, 2):
        committed, generated = 10, 1
        while generated < 22:
            d = Demand(sid, committed, prompt_len=10, max_tokens=22, window_rows=4)
            # a larger session is free the whole time: still no move
            verdict = room(d, caps, free_ids={1, 2} - {sid}, grow=8)
            assert verdict.action == "fits" and verdict.session_id == sid
            assert committed + verdict.rows <= caps[sid]
            # every draft but one rejected: the pending token and one draft kept, a bonus draw
            kept = rng.choice([1, 2])
            committed += kept
            generated += kept
    assert reply_end(10, 22, 4) == 36


def test_outgrowing_moves_while_larger_is_free_else_runs_then_pauses_and_resumes() -> None:
    caps, grow = CAPS, 8
    # in session 3 (16): committed 6 -> margin 14 fits: run
    assert room(_demand(3, 6), caps, {0}, grow).action == "run"
    # committed 9 -> margin 17 > 16: moves to the smallest free larger session
    verdict = room(_demand(3, 9), caps, {0, 2, 4}, grow)
    assert (verdict.action, verdict.session_id, verdict.rows) == ("move", 2, 4)
    # no larger one free: keeps running while rows fit, fewer of them near the end
    assert room(_demand(3, 9), caps, {4}, grow) == room(_demand(3, 9), caps, set(), grow)
    assert room(_demand(3, 9), caps, {4}, grow).action == "run"
    assert room(_demand(3, 14), caps, set(), grow).rows == 2
    # full: pauses, since larger sessions exist
    paused = room(_demand(3, 16), caps, {4}, grow)
    assert (paused.action, paused.rows) == ("pause", 0)
    # one frees: resumes by moving
    resumed = room(_demand(3, 16), caps, {1}, grow)
    assert (resumed.action, resumed.session_id, resumed.rows) == ("move", 1, 4)


def test_no_wait_without_a_larger_session() -> None:
    equal = (32, 32, 32)
    assert room(_demand(1, 20), equal, {0, 2}, grow=16).action == "run"
    end = room(_demand(1, 32), equal, {0, 2}, grow=16)
    assert (end.action, end.rows) == ("end", 0)
    assert room(_demand(0, 64), CAPS, {1, 2, 3, 4}, grow=8).action == "end"


def test_the_target_holds_the_next_margin_capped_at_the_largest() -> None:
    caps = (40, 24, 16)
    # committed 16, margin 20 -> needs 36: the free 24 is not enough, 40 is busy: pause
    assert room(_demand(2, 16), caps, {1}, grow=20).action == "pause"
    assert room(_demand(2, 16), caps, {0, 1}, grow=20).session_id == 0
    # a margin past the largest session: the largest still takes it
    assert room(_demand(2, 16), caps, {0, 1}, grow=1000).session_id == 0


def test_rooms_hands_each_free_session_to_one_stream_in_order() -> None:
    demands = {7: _demand(3, 16), 8: _demand(4, 16), 9: Demand(1, 5, 4, 1, 4)}
    verdicts = rooms(demands, CAPS, {0}, grow=8)
    assert verdicts[7].action == "move" and verdicts[7].session_id == 0
    assert verdicts[8].action == "pause"
    assert verdicts[9].action == "fits"


@pytest.mark.parametrize(
    "demand",
    [Demand(5, 0, 1, 1, 1), Demand(0, 65, 1, 1, 1), Demand(0, 1, 1, 1, 0), Demand(0, -1, 1, 1, 1)],
)
def test_room_refuses_inconsistent_demands(demand: Demand) -> None:
    with pytest.raises(ValueError):
        room(demand, CAPS, set(), grow=8)


def test_margin_arithmetic_is_checked() -> None:
    with pytest.raises(ValueError, match="sum past"):
        choose_session((MAX_TOKENS,), {0}, MAX_TOKENS - 10, 100, 4, 8)
