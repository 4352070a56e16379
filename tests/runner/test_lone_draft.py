"""Drafted lone steps (runner/lone_draft.py) on the CPU: a drafted step keeps the target's
greedy draws up to the first draft that differs, commits the state after them, and drafts the
next window on the device; replies equal plain decoding's, alone, together, across stops
inside a step, hand-offs and sized sessions."""

import dataclasses

import pytest
import torch

from flashlane.drafting.mtp import MtpDrafter
from flashlane.lanes.records import Draws, Window
from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.runner.backend import ModelBackend
from flashlane.runner.lone import LoneDriver
from tests.runner.test_exact import COSTS, prompts, serial
from tests.runner.test_lone import (
    GREEDY,
    prefilled,
    state_of,
    with_arrivals,
    with_lone,
    without_lone,
)

DRAFTING = dataclasses.replace(GREEDY, draft=True)


@pytest.mark.parametrize("depth", [1, 3])
def test_drafted_steps_keep_the_greedy_draws_and_their_state(tiny_ckpt, depth):
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[1]  # 70 tokens: sparse blocks chosen
    want, _ = serial(model, cfg, prompt, 40)
    s, first = prefilled(model, cfg, prompt)
    driver = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0))
    drafting = driver.drafting
    drafting.depth = depth
    got = [first]
    draws = [Draws(DRAFTING, 0, prompt, got)]  # the host drafter's specs read the reply

    def take(token, finite):
        assert finite
        got.append(token)
        return len(got) < 30

    steps = drafting.decode([0], [first], [len(prompt)], 40, 400, [take], [0], draws)
    # it stopped after the landed step that reached 30 tokens, with one more in flight
    assert got[:30] == want[:30] and got == want[: len(got)]
    assert len(got) - 1 >= steps and s.length == len(prompt) + len(got) - 1
    _, ref_s = serial(model, cfg, prompt, len(got))
    for a, b in zip(state_of(s), state_of(ref_s)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # the first step had no hints: its drafts were padding, counted neither drafted nor landed
    assert drafting.num_drafted == (steps - 1) * depth
    # the next call goes on from the device's own pending token and drafts
    more = drafting.decode(
        [0], [got[-1]], [s.length], 3, 400, [lambda t, f: bool(got.append(t)) or True], [0], draws
    )
    assert more == 3 and got == want[: len(got)] and drafting.num_carried == 1
    drafting.depth = depth + 1  # another depth: its buffers start from the host
    drafting.decode(
        [0], [got[-1]], [s.length], 2, 400, [lambda t, f: bool(got.append(t)) or True], [0], draws
    )
    assert got == want[: len(got)] and drafting.num_carried == 1


def test_a_first_step_takes_its_hints_after_the_head_absorbs_the_queue(tiny_ckpt):
    """A call that starts from the host (no carry): the head absorbs every waiting cell (no
    host chain), and the first step verifies the hints; right hints all land, wrong ones
    change no token."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[1]
    want, _ = serial(model, cfg, prompt, 20)
    for hint, lands in ((want[1:3], 2), ([want[2], want[1]], 0)):
        s, first = prefilled(model, cfg, prompt)
        drafter = MtpDrafter(model, confidence=0.0)
        drafting = LoneDriver(model, [s], drafter=drafter).drafting
        rows = torch.zeros(3, cfg.hc_count * cfg.hidden_size, dtype=torch.float64)
        drafter.absorb_later(0, rows, [7, 8, 9], 5, None)
        length, absorbed = s.mtp_length, []
        absorb = drafter.absorb_waiting

        def spy(
            stream_ids, sessions, pending, absorb=absorb, drafter=drafter, absorbed=absorbed, **kw
        ):
            absorb(stream_ids, sessions, pending, **kw)
            absorbed.append((drafter.queued(0), sessions[0].mtp_length))

        drafter.absorb_waiting = spy
        drafter.draft = lambda *a: pytest.fail("a host chain ran")
        got = [first]
        take = lambda t, f, got=got: bool(got.append(t)) or True  # noqa: E731
        drafting.decode([0], [first], [len(prompt)], 1, 400, [take], [0], [None], [hint])
        assert absorbed == [(0, length + 3)]
        assert got == want[: len(got)] and drafting.landed == [lands]
        assert drafting.num_drafted == 2 and drafting.num_landed == lands


def test_the_chain_reads_no_position_left_unwritten(tiny_ckpt):
    """A prompt kept without its next token leaves its last row waiting (dangling); a drafted
    call completes that cell with the pending token before its head absorbs the queue, so the
    device's chain reads only cells written: the same drafts whatever the head's cache held
    before (NaN or zeros)."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[1]
    drafts = []
    for fill in (float("nan"), 0.0):
        s = SessionState.empty(cfg, 512, torch.float64, torch.float64)
        backend = ModelBackend(model, [s], max_rows=16, mtp_confidence=0.0)
        window = Window(0, 0, 0, tuple(prompt), Draws(DRAFTING, 0, prompt, []), "prompt", True)
        first = backend.verify([window])[0].sampled[0]
        backend.keep({0: len(prompt)})
        assert backend.drafter.waiting[0].is_dangling
        for cache in s.mtp:
            for t in (cache.k, cache.v, cache.index_keys, cache.block_keys):
                t.fill_(fill)
        drafting = LoneDriver(model, [s], drafter=backend.drafter).drafting
        got = [first]
        take = lambda t, f, got=got: bool(got.append(t)) or True  # noqa: E731
        drafting.decode([0], [first], [len(prompt)], 1, 400, [take], [0], [None])
        carry = drafting.carry[0]
        drafts.append(carry[1].drafts[carry[2]].tolist())
    assert drafts[0] == drafts[1]


def test_no_drafted_step_past_the_room(tiny_ckpt):
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[0]
    s, first = prefilled(model, cfg, prompt)
    drafting = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0)).drafting
    assert (
        drafting.decode([0], [first], [len(prompt)], 10, 2, [lambda t, f: True], [0], [None])
        is None
    )  # a depth-2 step needs 3 positions
    assert s.length == len(prompt)
    n = drafting.decode([0], [first], [len(prompt)], 10, 7, [lambda t, f: True], [0], [None])
    assert n == 2 and s.length <= len(prompt) + 6


@pytest.fixture(scope="module")
def llm(tiny_ckpt):
    return LLM(str(tiny_ckpt), costs=COSTS, parallel=8, max_rows=16)


def with_drafting_lone(llm, steps: int, streams: int = 1, depth: int = 2):
    driver = with_lone(llm, steps, streams, drafter=llm.engine.backend.drafter)
    driver.drafting.depth = depth
    driver.drafting.choose = lambda ids, *rest: depth  # always
    return driver


def plain(params):
    return [dataclasses.replace(q, draft=False) for q in params]


@pytest.mark.parametrize("steps,streams", [(1, 1), (6, 1), (32, 1), (6, 4)])
def test_drafted_lone_replies_equal_plain_replies(llm, steps, streams):
    ps = prompts()[:5]
    params = [dataclasses.replace(DRAFTING, max_tokens=m) for m in (40, 7, 33, 1, 25)]
    without_lone(llm)
    want = [o.token_ids for o in llm.generate(ps, plain(params))]
    driver = with_drafting_lone(llm, steps, streams)
    try:
        if streams == 1:
            got = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)]
        else:
            got = [o.token_ids for o in llm.generate(ps, params)]
    finally:
        without_lone(llm)
    assert got == want
    assert driver.drafting.num_drafted > 0  # drafted steps ran
    assert driver.widest == streams
    if steps > 1:  # calls went on from the device's drafts, the streams left when others ended
        assert driver.drafting.num_carried > 0


def test_drafted_lone_stop_token_inside_a_step(llm):
    prompt = prompts()[2]
    without_lone(llm)
    full = llm.generate(prompt, GREEDY)[0].token_ids
    for cut in (5, 6, 7):
        stop = dataclasses.replace(DRAFTING, stop_token_ids=[full[cut]])
        want = llm.generate(prompt, plain([stop])[0])[0]
        with_drafting_lone(llm, 32, depth=3)
        try:
            got = llm.generate(prompt, stop)[0]
        finally:
            without_lone(llm)
        assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason


def test_drafted_lone_hands_off_and_takes_back(llm):
    """Work arriving while a drafting stream decodes alone on drafted steps: it drafts in
    shared rounds with the others, comes back alone, and every reply equals its plain one."""
    ps = prompts()[:4]
    params = [dataclasses.replace(DRAFTING, max_tokens=m) for m in (40, 12, 20, 8)]
    without_lone(llm)
    want = [llm.generate(p, q)[0].token_ids for p, q in zip(ps, plain(params))]
    driver = with_drafting_lone(llm, 4)
    # every fifth landed token, work "arrives"
    assert with_arrivals(llm, ps, params, 4, interrupt_every=5)[0] == want
    assert driver.drafting.num_drafted > 0


def test_drafted_lone_stream_moves_to_a_larger_session(tiny_ckpt):
    sized = LLM(str(tiny_ckpt), costs=COSTS, max_rows=16, slot_contexts="96,512", slot_grow=8)
    prompt = prompts()[1]  # 70 tokens: admitted to the 96-position session
    params = dataclasses.replace(DRAFTING, max_tokens=120)
    without_lone(sized)
    want = sized.generate(prompt, plain([params])[0])[0]
    driver = with_drafting_lone(sized, 32)
    try:
        got = sized.generate(prompt, params)[0]
    finally:
        without_lone(sized)
    assert got.token_ids == want.token_ids and got.finish_reason == want.finish_reason
    assert got.stats.moves == want.stats.moves >= 1
    assert driver.drafting.num_drafted > 0


def test_the_embedded_models_drafts_land_on_drafted_lone_steps():
    """With a trained head (the embedded model) drafted steps keep more than a token a step
    on a code prompt, and the reply is the plain one."""
    llm = LLM(costs=COSTS, parallel=2, max_rows=16)
    prompt = "def fibonacci(n):\n"
    params = dataclasses.replace(DRAFTING, max_tokens=48, ignore_eos=True)
    without_lone(llm)
    want = llm.generate(prompt, plain([params])[0])[0].token_ids
    driver = with_drafting_lone(llm, 32)
    try:
        got = llm.generate(prompt, params)[0].token_ids
    finally:
        without_lone(llm)
    assert got == want
    d = driver.drafting
    assert d.num_landed > 0.3 * d.num_drafted
    assert driver.num_steps < 0.75 * len(want)


def test_a_carried_call_folds_its_steps_not_its_load(tiny_ckpt):
    """A drafted call that goes on from the last one's carry loads without an absorb: its
    load would understate the next absorbing call's, so only its steps are folded."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[1]
    s, first = prefilled(model, cfg, prompt)
    driver = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0))
    drafting, got = driver.drafting, [first]
    draws = [Draws(DRAFTING, 0, prompt, got)]
    take = lambda t, f: bool(got.append(t)) or True  # noqa: E731
    drafting.decode([0], [first], [len(prompt)], 5, 400, [take], [0], draws)
    key = (1, drafting.depth)
    assert drafting.num_carried == 0 and key in driver.load_ms and key in driver.step_ms
    load, step = driver.load_ms[key], driver.step_ms[key]
    driver.step_ms[key] = step + 1000.0  # so a fold shows
    drafting.decode([0], [got[-1]], [s.length], 5, 400, [take], [0], draws)
    assert drafting.num_carried == 1
    assert driver.load_ms[key] == load and driver.step_ms[key] != step + 1000.0


def test_the_host_tells_the_rule_what_the_reply_still_wants(llm):
    """run_lone passes each drafted call the tokens each reply still wants (`left`), over
    which choose prices a drafted call's load; the call's steps stay lone_steps at most."""
    seen = []
    driver = with_drafting_lone(llm, 8)
    driver.drafting.choose = lambda ids, budget=None, left=None, *rest: (
        seen.append((budget, left)) or 2
    )
    try:
        params = dataclasses.replace(DRAFTING, max_tokens=20)
        llm.generate(prompts()[0], params)
    finally:
        without_lone(llm)
    assert seen and all(budget == min(8, *left) for budget, left in seen)
    assert seen[0][1] == [19]  # the prompt's round gave the first of 20 tokens
    assert [left for _, [left] in seen] == sorted({left for _, [left] in seen}, reverse=True)


def test_a_row_without_a_finite_logit_ends_its_step(tiny_ckpt, monkeypatch):
    """A window row whose logits are all NaN: its draw goes to the take marked not finite, no
    draft after it lands, so it is the step's last token, and the tokens before it are the
    greedy ones."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[2]
    want, _ = serial(model, cfg, prompt, 30)
    s, first = prefilled(model, cfg, prompt)
    drafting = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0)).drafting
    # draft 1 the true token; draft 2 the id a row of NaN draws (the first): it must not land
    monkeypatch.setattr(drafting, "_first_drafts", lambda ids, sids, draws: [[want[1], 0]])
    logits, calls = model.head_logits, [0]

    def poisoned(r, xn=None):
        out = logits(r, xn)
        calls[0] += 1
        if calls[0] == 1:
            out[1] = float("nan")  # the window's second row: the draw after draft 1
        return out

    monkeypatch.setattr(model, "head_logits", poisoned)
    got = []
    drafting.decode(
        [0],
        [first],
        [len(prompt)],
        1,
        400,
        [lambda t, f: bool(got.append((t, f))) or f],
        [0],
        [None],
    )
    assert got == [(want[1], True), (0, False)]
