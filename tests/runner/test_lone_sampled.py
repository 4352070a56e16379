"""Sampled streams on the lone driver (runner/lone.py with sampling/lone_draw.KeyedDraw) on
the CPU: their replies equal shared rounds' replies token for token, alone, several together
(greedy beside sampled), across hand-offs; lone_streams admits exactly the rows the fused
keyed draw takes (top_p too: tests/runner/test_lone_top_p.py); a row without a token ends the
stream with the shared rounds' error."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import Draws
from flashlane.llm import LLM
from flashlane.request import SamplingParams
from flashlane.runner.lone import LoneDriver
from tests.runner.test_exact import COSTS, prompts
from tests.runner.test_lone import (
    lone_run,
    prefilled,
    with_arrivals,
    with_lone,
    without_lone,
)

SAMPLED = [
    SamplingParams(max_tokens=30, seed=7, draft=False),
    SamplingParams(max_tokens=9, temperature=0.7, seed=2**63 + 5, draft=False),
    SamplingParams(max_tokens=25, temperature=1.3, top_k=5, seed=123, draft=False),
    SamplingParams(max_tokens=33, temperature=0.9, min_p=0.05, seed=99, draft=False),
    SamplingParams(max_tokens=20, temperature=2.0, top_k=40, min_p=0.01, seed=-3, draft=False),
    SamplingParams(max_tokens=1, temperature=1.0, seed=11, draft=False),
]

# rows the fused draw does not take: drawn on the host every lone step, with the reply so far
PENALIZED = [
    SamplingParams(max_tokens=28, temperature=0.0, repetition_penalty=1.5, draft=False),
    SamplingParams(
        max_tokens=24, temperature=0.3, presence_penalty=1.5, frequency_penalty=0.8, seed=5
    ),
    SamplingParams(max_tokens=20, temperature=0.0, logit_bias={5: 4.0, 9: -2.0}, draft=False),
    SamplingParams(max_tokens=26, temperature=1.2, top_k=300, seed=8, draft=False),
]
PENALIZED[1] = dataclasses.replace(PENALIZED[1], draft=False)


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)


def shared(llm, ps, params):
    without_lone(llm)
    return [llm.generate(p, q)[0] for p, q in zip(ps, params)]


@pytest.mark.parametrize("steps", [1, 6, 32])
def test_sampled_lone_replies_equal_shared_replies(llm, steps):
    ps = prompts()[: len(SAMPLED)]
    want = shared(llm, ps, SAMPLED)
    got, driver = lone_run(llm, lambda: [llm.generate(p, q)[0] for p, q in zip(ps, SAMPLED)], steps)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.finish_reason for g in got] == [w.finish_reason for w in want]
    assert [g.seed for g in got] == [w.seed for w in want]
    assert driver.num_steps >= sum(len(w.token_ids) - 1 for w in want) - 1  # all lone
    assert any(k[2] for k in driver.io)  # the keyed buffers served them


@pytest.mark.parametrize("steps", [1, 6, 32])
def test_penalized_lone_replies_equal_shared_replies(llm, steps):
    """Penalized rows beside a greedy one, four streams in one lone call: each step's host
    draw reads the reply as it stood (a penalty that read a stale reply would drift)."""
    ps = prompts()[:5]
    params = [SamplingParams(max_tokens=26, temperature=0.0, draft=False), *PENALIZED]
    want = shared(llm, ps, params)
    unpenalized = [
        dataclasses.replace(
            p, repetition_penalty=1.0, presence_penalty=0, frequency_penalty=0, logit_bias=None
        )
        for p in params[1:4]
    ]
    # the penalties change these replies (a draw that ignored them would fail below)
    plain = shared(llm, ps[1:4], unpenalized)
    assert [a.token_ids != b.token_ids for a, b in zip(want[1:4], plain)] == [True] * 3
    got, driver = lone_run(llm, lambda: llm.generate(ps, params), steps, streams=5)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert driver.num_steps >= max(len(w.token_ids) for w in want) - 2  # all lone
    assert driver.widest == 5


def test_penalized_lone_hands_off_when_work_arrives_and_takes_back(llm):
    hands_off_and_takes_back(llm, PENALIZED)


def test_unseeded_sampled_reply_reproduces_through_its_returned_seed(llm):
    """A request without a seed gets a fresh one; replayed with it on shared rounds, the lone
    reply comes back."""
    params = SamplingParams(max_tokens=24, temperature=0.8, top_k=20, draft=False)
    with_lone(llm, 8)
    try:
        got = llm.generate(prompts()[2], params)[0]
    finally:
        without_lone(llm)
    again = llm.generate(prompts()[2], dataclasses.replace(params, seed=got.seed))[0]
    assert got.token_ids == again.token_ids


def test_greedy_and_sampled_streams_together_reply_as_shared_rounds(llm):
    ps = prompts()[:5]
    greedy = SamplingParams(max_tokens=26, temperature=0.0, draft=False)
    params = [greedy, *SAMPLED[:4]]
    want = [o.token_ids for o in shared(llm, ps, params)]
    got, driver = lone_run(
        llm, lambda: [o.token_ids for o in llm.generate(ps, params)], 5, streams=4
    )
    assert got == want
    assert driver.num_steps > 10 and driver.widest == 4


def hands_off_and_takes_back(llm, params) -> None:
    """Four streams with these params on the lone driver, interrupted by arriving work every
    6 steps: the replies of shared rounds."""
    ps = prompts()[:4]
    want = [o.token_ids for o in shared(llm, ps, params)]
    driver = with_lone(llm, 4)
    got, _ = with_arrivals(llm, ps, params, 5, interrupt_every=6)
    assert got == want
    assert driver.num_steps > 0


def test_sampled_lone_hands_off_when_work_arrives_and_takes_back(llm):
    hands_off_and_takes_back(llm, SAMPLED[:4])


def test_drafting_sampled_stream_runs_plain_keyed_steps(tiny_ckpt):
    """A sampled stream that drafts goes lone on plain keyed steps (drafted lone steps draw
    greedily), its cells queued for its MTP head; the reply is its undrafted one."""
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)
    params = dataclasses.replace(SAMPLED[3], draft=True)
    want = shared(llm, [prompts()[1]], [dataclasses.replace(params, draft=False)])[0]
    from flashlane.drafting.mtp import MtpDrafter

    got, driver = lone_run(
        llm,
        lambda: llm.generate(prompts()[1], params)[0],
        6,
        drafter=MtpDrafter(llm.engine.model, 0.0),
    )
    assert got.token_ids == want.token_ids
    assert driver.num_steps > 0 and driver.drafting.num_calls == 0


def test_drafting_stream_with_logprobs_runs_plain_keyed_steps(tiny_ckpt):
    """A greedy drafting stream that asks for logprobs goes lone on plain keyed steps
    (drafted lone steps report none): its tokens and logprobs are its undrafted ones."""
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)
    params = SamplingParams(max_tokens=24, temperature=0.0, logprobs=3, draft=True)
    want = shared(llm, [prompts()[2]], [dataclasses.replace(params, draft=False)])[0]
    from flashlane.drafting.mtp import MtpDrafter

    got, driver = lone_run(
        llm,
        lambda: llm.generate(prompts()[2], params)[0],
        6,
        drafter=MtpDrafter(llm.engine.model, 0.0),
    )
    assert (got.token_ids, got.logprobs) == (want.token_ids, want.logprobs)
    assert driver.num_steps > 0 and driver.drafting.num_calls == 0


@pytest.mark.parametrize(
    "params,lone",
    [
        (SamplingParams(temperature=0.0), True),
        (SamplingParams(temperature=0.8, seed=1), True),
        (SamplingParams(top_k=128, min_p=0.2, seed=1), True),
        (SamplingParams(top_p=0.9, seed=1), True),  # one step in flight: the host may settle it
        (SamplingParams(top_k=5, top_p=0.5, seed=1), True),
        (SamplingParams(top_k=129, seed=1), True),  # beyond the kernels' top_k: the host's
        (SamplingParams(repetition_penalty=1.2, seed=1), True),
        (SamplingParams(presence_penalty=0.5, seed=1), True),
        (SamplingParams(temperature=0.0, frequency_penalty=0.7), True),
        (SamplingParams(logit_bias={3: 2.0}, seed=1), True),
        (SamplingParams(logprobs=2, seed=1), True),  # the host adds them from kept logits
        (SamplingParams(temperature=0.0, logprobs=0), True),
        (SamplingParams(temperature=0.0, logprobs=5, presence_penalty=0.5), True),
    ],
)
def test_lone_streams_admits_every_sampled_row(llm, params, lone):
    params = dataclasses.replace(params, max_tokens=12, draft=False)
    want = shared(llm, [prompts()[0]], [params])[0]
    got, driver = lone_run(llm, lambda: llm.generate(prompts()[0], params)[0], 8)
    assert got.token_ids == want.token_ids
    assert got.logprobs == want.logprobs  # bit for bit, None where not asked
    assert (driver.num_steps > 0) == lone


POISONS = {  # what a poisoned row gets, and the error shared rounds give for it
    "nan": ({9: float("inf"), 3: float("nan")}, "NaN logit at id 3"),
    "inf": ({9: float("inf"), 12: float("inf")}, "+inf logit at id 9"),
    "none": (None, "no finite candidate logit"),
}


def poison_rows(model, token_id: int, poison: dict | None, monkeypatch):
    """Every logits row whose greedy token is `token_id` gets `poison` (id -> value; None:
    every id -inf), in shared rounds and lone steps alike (both read model.head_logits)."""
    head = model.head_logits

    def poisoned(r, xn=None):
        out = head(r, xn).clone()
        hit = out.argmax(1) == token_id
        for i, v in (poison or {}).items():
            out[hit, i] = v
        if poison is None:
            out[hit] = -float("inf")
        return out

    monkeypatch.setattr(model, "head_logits", poisoned)


def greedy_tokens_of_rows(llm, prompt, params, monkeypatch) -> list[int]:
    """The greedy token of each logits row a shared-rounds reply reads, in order."""
    model, head, seen = llm.engine.model, llm.engine.model.head_logits, []

    def watched(r, xn=None):
        out = head(r, xn)
        seen.append(int(out[-1].argmax()))
        return out

    monkeypatch.setattr(model, "head_logits", watched)
    shared(llm, [prompt], [params])
    monkeypatch.setattr(model, "head_logits", head)
    return seen


@pytest.mark.parametrize("poison", list(POISONS))
def test_a_failed_row_ends_the_reply_with_the_shared_rounds_error(llm, monkeypatch, poison):
    params, prompt = SAMPLED[0], prompts()[4]
    clean = shared(llm, [prompt], [params])[0]
    seen = greedy_tokens_of_rows(llm, prompt, params, monkeypatch)
    values, error = POISONS[poison]
    poison_rows(llm.engine.model, seen[8], values, monkeypatch)  # a later row's greedy token
    want = shared(llm, [prompt], [params])[0]
    assert want.finish_reason == "error" and 2 < len(want.token_ids) < len(clean.token_ids)
    assert want.error == f"sampling failed: {error}"
    got, driver = lone_run(llm, lambda: llm.generate(prompt, params)[0], 32)
    assert (got.token_ids, got.finish_reason, got.error) == (
        want.token_ids,
        want.finish_reason,
        want.error,
    )
    assert driver.num_steps > 0


def test_the_driver_reports_a_failed_row_with_its_code(tiny_ckpt, monkeypatch):
    """Runner level: a keyed lone step whose row holds a NaN lands flag 0, its failure code,
    and the step in flight lands after it; the tokens before it are the shared rounds'."""
    from flashlane.models.loader import load_checkpoint
    from flashlane.sampling.spec import failure

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    s, first = prefilled(model, cfg, prompts()[2])
    head, calls = model.head_logits, [0]

    def poisoned(r, xn=None):
        out = head(r, xn).clone()
        calls[0] += 1
        if calls[0] == 3:
            out[0, 6] = float("nan")
        return out

    monkeypatch.setattr(model, "head_logits", poisoned)
    got = []
    draws = Draws(SAMPLED[0], 5, [], [])
    LoneDriver(model, [s]).decode(
        0, first, len(prompts()[2]), 10, lambda t, f: bool(got.append((t, f))) or f, -1, draws
    )
    assert [f for _, f in got] == [True, True, False, True]
    assert str(failure(got[2][0])) == "NaN logit at id 6"


def test_bad_input_is_refused_as_before_with_the_lone_driver_on(llm):
    """Bad params fail at once (no state touched); a logit_bias id outside the vocabulary
    fails its stream in a shared round (bias keeps it off the lone driver) with the same
    error, and a sampled request after it goes lone as usual."""
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=-1)
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)
    bad = SamplingParams(max_tokens=8, seed=1, logit_bias={10**6: 1.0}, draft=False)
    want = shared(llm, [prompts()[0]], [bad])[0]
    assert want.finish_reason == "error" and "logit_bias id 1000000" in want.error
    driver = with_lone(llm, 8)
    try:
        got = llm.generate(prompts()[0], bad)[0]
        after = llm.generate(prompts()[0], SAMPLED[0])[0]
    finally:
        without_lone(llm)
    assert (got.token_ids, got.finish_reason, got.error) == (
        want.token_ids,
        want.finish_reason,
        want.error,
    )
    assert after.token_ids == shared(llm, [prompts()[0]], [SAMPLED[0]])[0].token_ids
    assert driver.num_steps > 0


def test_greedy_calls_keep_the_one_launch_greedy_step(llm):
    """Only calls with a sampled stream take the keyed buffers: greedy-only calls run as
    before (kernels.greedy_step), and each kind keeps its own buffers."""
    greedy = SamplingParams(max_tokens=12, temperature=0.0, draft=False)
    driver = with_lone(llm, 6)
    try:
        llm.generate(prompts()[0], greedy)
        assert driver.io and not any(keyed for _, _, keyed in driver.io)
        llm.generate(prompts()[0], SAMPLED[0])
    finally:
        without_lone(llm)
    assert sorted(driver.io) == [(1, 0, False), (1, 0, True)]
    assert driver.io[(1, 0, True)].key((0,))[0] == "keyed"


def test_sampled_streams_stay_on_shared_rounds_while_the_driver_refuses_them(llm):
    """`LoneDriver.sampled` off (CUDA's default until its GPU test passes): a sampled stream
    stays on shared rounds, a greedy one still goes lone."""
    params = dataclasses.replace(SAMPLED[0], max_tokens=12)
    greedy = SamplingParams(max_tokens=12, temperature=0.0, draft=False)
    want = shared(llm, [prompts()[0]] * 2, [params, greedy])
    driver = with_lone(llm, 8)
    driver.sampled = False
    try:
        got = llm.generate(prompts()[0], params)[0]
        assert got.token_ids == want[0].token_ids and driver.num_steps == 0
        got = llm.generate(prompts()[0], greedy)[0]
        assert got.token_ids == want[1].token_ids and driver.num_steps > 0
    finally:
        without_lone(llm)
