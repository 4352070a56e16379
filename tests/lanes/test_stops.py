"""Stop conditions, the thinking budget and the loop guard: drafted replies stop where serial
ones do."""

import pytest

from flashlane.lanes.stops import LOOP_SPAN, StopRules
from flashlane.request import SamplingParams
from flashlane.sessions.slots import NoSessionFits
from tests.lanes.fake import (
    FakeBackend,
    alone,
    copy_model,
    hash_model,
    make_host,
    run_to_end,
    serial,
)

PROMPT = [11, 12, 13]
DRAFTED = {"mtp_drafts": 4, "copy_drafts": 8, "unpriced": True}
PLAIN = {"mtp_drafts": 0, "copy_drafts": 0}
CLOSE = (90, 91, 92)  # "\n", "</think>", "\n\n"
THINK = StopRules(think_close_ids=CLOSE, think_end_id=91)


def text_of(ids):
    return "".join(chr(ord("a") + t % 26) for t in ids)


def both(prompt, params, rules=None, backend=None):
    """The reply drafted (every draft call's second draft wrong) and plain; they must agree."""
    wrong = {"wrong": lambda stream_id, call: 1, **(backend or {})}
    drafted = alone(wrong, prompt, params, rules, **DRAFTED)
    plain = alone(backend or {}, prompt, params, rules, **PLAIN)
    assert drafted.token_ids == plain.token_ids
    assert drafted.text == plain.text and drafted.finish_reason == plain.finish_reason
    return drafted


def test_max_tokens_ends_with_length():
    out = both(PROMPT, SamplingParams(max_tokens=17, temperature=0.0))
    assert out.token_ids == serial(hash_model, PROMPT, None, 17)
    assert out.finish_reason == "length"


@pytest.mark.parametrize("at", [0, 6, 13])
def test_eos_and_stop_token_ids_end_the_reply_on_that_token(at):
    full = serial(hash_model, PROMPT, None, 40)
    eos = full[at]
    cut = full.index(eos) + 1
    out = both(PROMPT, SamplingParams(max_tokens=40, temperature=0.0), StopRules({eos}))
    assert out.token_ids == full[:cut] and out.finish_reason == "stop"
    out = both(PROMPT, SamplingParams(max_tokens=40, temperature=0.0, stop_token_ids=[eos]))
    assert out.token_ids == full[:cut] and out.finish_reason == "stop"
    ignoring = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    assert both(PROMPT, ignoring, StopRules({eos})).token_ids == full


def test_stop_strings_end_on_decoded_text_and_are_cut_from_it():
    full = serial(hash_model, PROMPT, None, 40)
    stop = text_of(full[9:12])
    where = text_of(full).index(stop)
    rules = StopRules(detokenize=text_of)
    out = both(PROMPT, SamplingParams(max_tokens=40, temperature=0.0, stop=[stop]), rules)
    assert out.finish_reason == "stop"
    assert out.text == text_of(full)[:where]
    assert out.token_ids == full[: where + len(stop)]
    plain = both(PROMPT, SamplingParams(max_tokens=40, temperature=0.0), rules)
    assert plain.text == text_of(full)


@pytest.mark.parametrize("budget", [0, 1, 7, 20])
def test_thinking_budget_forces_the_close_by_token_count(budget):
    params = SamplingParams(max_tokens=40, temperature=0.0, thinking_budget=budget)
    out = both(PROMPT, params, THINK)
    tokens = out.token_ids
    assert tokens[budget : budget + 3] == list(CLOSE)
    thought = serial(hash_model, PROMPT, None, budget)
    assert tokens[:budget] == thought
    assert tokens[budget + 3 :] == serial(
        hash_model, PROMPT + tokens[: budget + 3], None, 37 - budget
    )


def test_thinking_that_closes_itself_is_not_forced():
    full = serial(hash_model, PROMPT, None, 40)
    rules = StopRules(think_close_ids=(90, full[4], 92), think_end_id=full[4])
    out = both(PROMPT, SamplingParams(max_tokens=40, temperature=0.0, thinking_budget=30), rules)
    assert out.token_ids == full


def test_loop_guard_forces_the_close_after_a_repeating_cycle():
    prompt = [30, 31, 32, 33, 34] * 3
    params = SamplingParams(max_tokens=LOOP_SPAN + 40, temperature=0.0, thinking_budget=10_000)
    out = both(prompt, params, THINK, backend={"model": copy_model})
    loop = LOOP_SPAN - 5 + 5  # the cycle is whole from the first reply token on
    assert out.token_ids[:loop] == serial(copy_model, prompt, None, loop)
    assert out.token_ids[loop : loop + 3] == list(CLOSE)
    unbudgeted = SamplingParams(max_tokens=LOOP_SPAN + 40, temperature=0.0)
    assert CLOSE[1] not in both(prompt, unbudgeted, THINK, {"model": copy_model}).token_ids


def test_a_full_session_ends_the_reply_with_length():
    prompt = list(range(10, 20))
    params = SamplingParams(max_tokens=100, temperature=0.0)
    outs = []
    for lanes in (DRAFTED, PLAIN):
        backend = FakeBackend(capacities=(64,), wrong=lambda stream_id, call: 1)
        host = make_host(backend, num_sessions=1, grow=8, **lanes)
        host.submit("r", prompt, params)
        outs.append(run_to_end(host)["r"])
        assert host.sessions.num_free == 1
    assert outs[0].token_ids == outs[1].token_ids == serial(hash_model, prompt, None, 55)
    assert outs[0].finish_reason == "length"


def test_a_prompt_no_session_holds_is_refused_at_once():
    host = make_host(FakeBackend(capacities=(40,)), num_sessions=1)
    with pytest.raises(NoSessionFits):
        host.submit("big", list(range(10, 50)), SamplingParams(max_tokens=8))
    assert not host.has_work


def test_forced_rows_stay_within_the_row_cap():
    backend = FakeBackend(max_rows=2)
    host = make_host(backend, THINK, max_rows=2, mtp_drafts=3)
    for i in range(2):
        host.submit(
            f"r{i}", [11 + i], SamplingParams(max_tokens=20, temperature=0.0, thinking_budget=2)
        )
    outs = run_to_end(host)
    assert all(o.token_ids[2:5] == list(CLOSE) for o in outs.values())
    assert max(sum(w) for w in backend.widths) == 2


def test_the_text_without_stop_strings_is_decoded_as_the_host_reports():
    """No stop string reads the text token by token, so the host decodes it when it reports
    (`read_text`: the tokens since its last report in one add), not twice a token: every
    update's text begins the reply's text (a byte-level decoder: text that ends in bytes of
    no whole character waits), and the updates make the whole text. Drafted rounds report
    several tokens at once."""
    full = serial(hash_model, PROMPT, None, 40)
    calls = []

    def utf8(ids):  # each token a byte: 0xc3 and 0xa9 make "é", others ASCII
        return bytes(0xC3 if t % 5 == 0 else 0xA9 if t % 5 == 1 else 97 + t % 26 for t in ids
                     ).decode("utf-8", errors="replace")  # fmt: skip

    def counted(ids):
        calls.append(len(ids))
        return utf8(ids)

    host = make_host(FakeBackend(), StopRules(detokenize=counted), **DRAFTED)
    host.submit("r", PROMPT, SamplingParams(max_tokens=40, temperature=0.0))
    texts = []
    while host.has_work:
        for u in host.run_once():
            texts.append(u.text)
            assert utf8(u.stream.reply_ids).startswith("".join(texts))
    assert "".join(texts) == utf8(full)
    assert len(texts) < len(full) and len(calls) <= 2 * len(texts) + 2  # a report's, no more
