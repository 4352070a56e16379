"""The lone driver's depth rule (runner/lone_draft.Drafting.choose) on the CPU: whether a
call drafts, priced from the measured steps and loads, the landing rate and the tokens the
replies still want; the slower kind tried again, sooner while the landing is a guess; no
drafted step past the plan's rows."""

import copy
import math

import pytest
import torch

from flashlane.drafting.mtp import MtpDrafter
from flashlane.models.loader import load_checkpoint
from flashlane.runner.lone import LoneDriver
from tests.runner.test_exact import prompts, serial
from tests.runner.test_lone import prefilled


def test_drafting_is_chosen_while_it_pays(tiny_ckpt):
    """choose(): unmeasured sides first (drafted, then plain), then whichever gives more
    tokens a ms by the landing rate and the measured steps of the nearest session count,
    the slower kind tried again every PROBE_EVERY calls once the landing is measured."""
    from flashlane.runner.lone_draft import MAX_STREAMS, PROBE_EVERY, SURE_DRAFTS

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    s, _ = prefilled(model, cfg, prompts()[0])
    driver = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0))
    d = driver.drafting
    assert d.choose([0]) == 2
    driver.step_ms[(1, 2)] = 1.5
    assert d.choose([0]) == 0
    driver.step_ms[(1, 0)] = 1.0
    for _ in range(SURE_DRAFTS // 2):  # landing measured (SURE_DRAFTS), all but a half of it:
        d.stats.record([1.0, 1.0], 2)  # 1 + 0.97 + 0.94 tokens for 1.5x the time
        d.stats.record([1.0, 1.0], 0)  # ~1 + 0.5 + 0.49: still more than 1.5
    # four sessions: the figures of one stand in; the slower kind is tried after PROBE_EVERY
    # calls, then after twice as many while the tries confirm the measures
    picks = [d.choose([0, 1, 2, 3]) for _ in range(4 * PROBE_EVERY)]
    assert [i for i, p in enumerate(picks) if p == 0] == [PROBE_EVERY - 1, 3 * PROBE_EVERY - 1]
    driver.step_ms[(1, 2)] = 3.0  # now dearer than its tokens: tried again soon, then less
    picks = [d.choose([0]) for _ in range(PROBE_EVERY)]
    assert picks.count(0) == PROBE_EVERY - 1 and picks.count(2) == 1
    # a drafted try has the call's budget, weighed again after PROBE_STEPS steps (`tried`)
    budgets = []
    d.decode = lambda ids, tokens, positions, budget, *rest, **kw: budgets.append((budget, d.tried))
    for _ in range(2 * PROBE_EVERY):
        d.run([0], [5], [9], 64, 400, [None], [0], [None])
    assert budgets == [(64, [math.inf])]
    # past MAX_STREAMS sessions: plain steps, whatever the measures
    driver.step_ms[(1, 2)] = 1.5
    assert [d.choose([0, 1]) for _ in range(PROBE_EVERY)].count(2) == PROBE_EVERY - 1
    assert {d.choose(list(range(MAX_STREAMS + 1))) for _ in range(PROBE_EVERY)} == {0}


def test_a_drafted_step_holds_no_more_rows_than_the_plan(tiny_ckpt):
    """max_rows (the plan's rows a round): a drafted step of B sessions at depth K takes
    B*(K+1) rows, refused past it whatever the measures (plain steps), and a size past it is
    not captured at start (an engine hands its plan's rows to its driver: test_lone_gpu)."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    states = [prefilled(model, cfg, p)[0] for p in prompts()[:3]]
    driver = LoneDriver(model, states, drafter=MtpDrafter(model, confidence=0.0), max_rows=6)
    d = driver.drafting
    assert d.fits(2) and not d.fits(3)  # 2 x 3 rows fit 6, 3 x 3 do not
    assert d.choose([0, 1]) == 2 and d.choose([0, 1, 2]) == 0
    assert all(d.fits(n) for n in d.eager_sizes())
    unbounded = LoneDriver(model, states, drafter=MtpDrafter(model, confidence=0.0))
    assert unbounded.drafting.fits(3) and unbounded.drafting.choose([0, 1, 2]) == 2


def test_a_drafted_call_pays_its_load(tiny_ckpt):
    """The rule prices each kind's tokens with the time before its first step (load_ms),
    over the tokens its call gives: a plain call's steps one each, a drafted call's as many
    steps 1 + their expected landed drafts each, no more than the replies want (`left`).
    Drafted steps that win step for step lose a call too short to earn their load back."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    s, _ = prefilled(model, cfg, prompts()[0])
    driver = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0))
    d = driver.drafting
    driver.step_ms.update({(1, 0): 0.4, (1, 2): 0.6})
    # both depths land 5 in 6 (smoothed: 35 of 42, 30 of 36) over 40 drafted steps, a measured
    # landing (SURE_DRAFTS): 2.53 tokens a drafted step
    for landed, times in ((2, 29), (1, 5), (0, 6)):
        for _ in range(times):
            d.stats.record([1.0, 1.0], landed)
    assert d.stats.rate(1) == d.stats.rate(2) == 5 / 6
    assert d.choose([0], 32) == 2  # 0.24 ms a token (32 steps, 81 tokens) against 0.4
    driver.load_ms.update({(1, 0): 0.1, (1, 2): 6.0})  # a drafted call's host work first
    assert d.choose([0], 32) == 2  # 25.2 ms for 81 tokens: 0.31 a token against 0.40
    assert d.choose([0], 32, left=32) == 0  # a 32-token reply: 13.8 ms against 12.9
    assert d.choose([0], 8) == 0  # 10.8 ms for 20 tokens: 0.53 against 0.41
    # a call going on from a drafted call's carry absorbs nothing: it loads as a plain one
    assert d.choose([0], 8, carried=True) == 2  # 4.9 ms for 20 tokens: 0.24 against 0.41
    assert d.choose([0], 10_000, left=10_000) == 2  # a long call earns its load back


def test_a_verdict_against_drafting_on_few_drafts_is_tried_again_soon(tiny_ckpt):
    """Plain steps measured to win on fewer than SURE_DRAFTS drafts (one short try's) leave
    drafting tried every UNSURE_EVERY calls, not after PROBE_EVERY, until the landing is
    measured; then the verdict holds PROBE_EVERY calls."""
    from flashlane.runner.lone_draft import PROBE_EVERY, SURE_DRAFTS, UNSURE_EVERY

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    s, _ = prefilled(model, cfg, prompts()[0])
    driver = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0))
    d = driver.drafting
    driver.step_ms.update({(1, 0): 0.4, (1, 2): 0.64})
    for landed in (1, 0, 0, 1, 0, 0, 0):  # a try's seven steps: 2 of 7 land at depth 1
        d.stats.record([1.0, 1.0], landed)
    picks = [d.choose([0], 32) for _ in range(2 * PROBE_EVERY)]
    assert picks[0] == 0 and picks.count(2) >= 2 * PROBE_EVERY // UNSURE_EVERY - 1
    for _ in range(SURE_DRAFTS):  # measured: the same poor landing, plain steps hold
        d.stats.record([1.0, 1.0], 0)
    picks = [d.choose([0], 32) for _ in range(2 * PROBE_EVERY)]
    assert picks.count(2) <= 2


def test_a_call_is_priced_by_its_own_streams_landing(tiny_ckpt):
    """Each stream's expected tokens a drafted step lean on its own drafted steps' landing
    (Drafting.by_stream), and a call lasts as long as its slowest reply takes: a call whose
    replies all want 16 more tokens waits for the stream whose drafts miss (plain steps
    win), where a call bound by its steps gains from the others' drafts (drafting wins)."""
    from flashlane.lanes.stream import DraftStats
    from flashlane.runner.draft_prices import STREAM_PRIOR

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    states = [prefilled(model, cfg, p)[0] for p in prompts()[:2]]
    driver = LoneDriver(model, states, drafter=MtpDrafter(model, confidence=0.0))
    d = driver.drafting
    driver.step_ms.update({(2, 0): 0.4, (2, 2): 0.7})
    for landed, times in ((2, 29), (1, 5), (0, 6)):  # every stream's: 5 in 6 at each depth
        for _ in range(times):
            d.stats.record([1.0, 1.0], landed)
    poor = d.by_stream[7] = DraftStats()
    for _ in range(40):  # stream 7's own drafts: none of 40 landed
        poor.record([1.0, 1.0], 0)
    first = (5 / 6) * STREAM_PRIOR / (40 + STREAM_PRIOR)  # its second drafts: unreached
    assert d._expected([7]) == pytest.approx([1 + first + first * 5 / 6])
    assert d._expected([8]) == pytest.approx([1 + 5 / 6 + 25 / 36])  # none of its own
    # 16 tokens each: 13 drafted steps (9.1 ms) for the slow one, against 16 plain (6.4)
    assert d.choose([0, 1], 16, left=[16, 16], stream_ids=[7, 8]) == 0
    assert d.choose([0, 1], 16, left=[16, 16], stream_ids=[9, 8]) == 2
    assert d.choose([0, 1], 16, left=[16, 16]) == 2  # no stream named: everyone's landing
    # 16 steps either way: 11.2 ms for 60.5 tokens against 6.4 for 32
    assert d.choose([0, 1], 16, stream_ids=[7, 8]) == 2


def test_a_batch_is_priced_by_its_slowest_reply(tiny_ckpt):
    """Where every reply's tokens are known, drafting must also end the batch sooner: its
    slowest stream at its own landing, and new streams at the landing the slowest of as many
    had among the last streams that drafted (`Drafting.replies`). 8 new streams (MAX_STREAMS)
    whose past replies landed 1.3-2.5 tokens a step: the slowest of 8 (~1.43) makes 63 tokens
    in 44 drafted steps, 33.4 ms against 63 plain ones' 28.4; one new stream: the median,
    19.1 against 23.9. With too few replies ended, every stream's landing stands in. A
    landing guessed for a new stream drafts a try (PROBE_STEPS steps), not a whole call, and
    only where the guess gains more than the try's load."""
    from flashlane.runner.draft_prices import FEW_REPLIES
    from flashlane.runner.lone_draft import MAX_STREAMS

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    s, _ = prefilled(model, cfg, prompts()[0])
    driver = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0))
    d = driver.drafting
    driver.step_ms.update(
        {(1, 0): 0.38, (1, 2): 0.58, (MAX_STREAMS, 0): 0.45, (MAX_STREAMS, 2): 0.76}
    )
    for landed, times in ((2, 42), (1, 18), (0, 40)):  # 0.6 at depth 1, 0.7 at 2: 2.02
        for _ in range(times):
            d.stats.record([1.0, 1.0], landed)
    eight = list(range(MAX_STREAMS))
    past = {100 + i: 1.3 + 1.2 * i / (FEW_REPLIES - 2) for i in range(FEW_REPLIES - 1)}
    d.replies.update(past)
    assert d.choose(eight, 32, left=[63] * MAX_STREAMS, stream_ids=eight) == 2  # too few known
    assert d.probing  # a guess: a try of PROBE_STEPS steps, which measures them
    d.replies = {100 + i: 1.3 + 1.2 * i / 63 for i in range(64)}
    assert d.choose(eight, 32, left=[63] * MAX_STREAMS, stream_ids=eight) == 0
    assert d.choose([0], 32, left=[63], stream_ids=[0]) == 2 and d.probing
    assert d.choose(eight, 32, stream_ids=eight) == 2  # tokens unknown: per token only
    assert not d.probing
    # a guess must gain more than its try's load: everyone's landing (2.02 tokens a step,
    # too few replies known) ends the batch in 32 drafted steps, 24.3 ms + 2.5 to load
    # against 28.35 plain: 1.5 ms gained, less than the 2.5 a try would load
    d.replies = {}
    driver.load_ms[(MAX_STREAMS, 2)] = 2.5
    assert d.choose(eight, 32, left=[63] * MAX_STREAMS, stream_ids=eight) == 0
    for sid in eight:  # the same landing, measured: the streams' own (a try's), it drafts
        d.by_stream[sid] = copy.deepcopy(d.stats)
    assert d.choose(eight, 32, left=[63] * MAX_STREAMS, stream_ids=eight) == 2 and not d.probing


def test_a_drafted_call_tells_its_streams_landing(tiny_ckpt):
    """A drafted call records each stream's expected tokens a step by its own landing so
    far, once it offered REPLY_DRAFTS drafts (`Drafting.replies`, by stream id, the latest),
    whether or not its reply ended in the call: the slow replies end in plain calls."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[0]
    s, first = prefilled(model, cfg, prompt)
    d = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0)).drafting
    for sid, steps in ((7, 2), (8, 12), (8, 14)):  # 2 steps: too few drafts offered to tell
        d.decode([0], [first], [len(prompt)], steps, 400, [lambda t, f: True], [sid], [None])
    assert list(d.replies) == [8] and d.replies[8] == d._expected_of(d.by_stream[8])
    assert d.by_stream[8].offered[0] == 11 + 13  # each call's first step blind


def test_a_try_of_plain_steps_runs_a_few_steps(tiny_ckpt):
    """While drafting wins, plain steps are tried again every PROBE_EVERY calls, in a call
    of PROBE_STEPS plain steps (decode_many) whatever the call's budget, its streams
    told that none of their drafts ran; the calls between draft with the whole budget."""
    from flashlane.runner.lone_draft import PROBE_EVERY, PROBE_STEPS, SURE_DRAFTS

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    s, _ = prefilled(model, cfg, prompts()[0])
    driver = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0))
    d = driver.drafting
    driver.step_ms.update({(1, 0): 0.4, (1, 2): 0.6})
    for _ in range(SURE_DRAFTS):
        d.stats.record([1.0, 1.0], 2)
    plain, drafted = [], []
    driver.decode_many = lambda ids, tokens, positions, budget, *rest: plain.append(budget)
    d.decode = lambda ids, tokens, positions, budget, *rest, **kw: drafted.append(budget) or 1
    got = [d.run([0], [5], [9], 32, 400, [None], [0], [None]) for _ in range(PROBE_EVERY)]
    assert plain == [PROBE_STEPS] and drafted == [32] * (PROBE_EVERY - 1)
    assert got[-1] == ([0], [0]) and d.verdict["better"] == 2


def test_a_tried_batch_tells_its_streams_landing(tiny_ckpt):
    """A try's PROBE_STEPS drafted steps (the first blind) offer enough drafts for its
    streams to count among the replies the slowest reply is read from (REPLY_DRAFTS)."""
    from flashlane.runner.lone_draft import PROBE_STEPS, REPLY_DRAFTS

    assert PROBE_STEPS - 1 >= REPLY_DRAFTS
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[0]
    s, first = prefilled(model, cfg, prompt)
    d = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0)).drafting
    d.decode([0], [first], [len(prompt)], PROBE_STEPS, 400, [lambda t, f: True], [3], [None])
    assert list(d.replies) == [3]


def test_a_drafted_try_goes_on_while_its_landing_pays(tiny_ckpt):
    """A drafted try (a new stream's landing guessed) is one call: after PROBE_STEPS steps
    it goes on while drafted steps at the streams' own landing, with no load, still cost
    less a token than a new plain call (`_goes_on`), else it ends there (the step in flight
    lands too); either way its replies are the plain steps' (drafts are verified)."""
    from flashlane.runner.lone_draft import PROBE_STEPS

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[0]
    want, _ = serial(model, cfg, prompt, 40)
    for drafted_ms, ran in ((0.5, 24), (5.0, PROBE_STEPS + 1)):
        s, first = prefilled(model, cfg, prompt)
        d = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0)).drafting
        d.driver.step_ms.update({(1, 0): 1.0, (1, 2): drafted_ms})
        d.tried, got = [math.inf], [first]
        take = got.append  # every token taken: the call runs until the try's verdict
        n = d.decode([0], [first], [len(prompt)], 24, 400,
                     [lambda t, f, take=take: take(t) is None], [3], [None])  # fmt: skip
        assert n == ran and got == want[: len(got)]


def test_no_drafted_step_is_launched_past_the_one_that_may_end_the_call(tiny_ckpt):
    """Two steps are in flight, except while the one in flight may land a reply's last
    wanted token (`left`): a step launched past it would run for nothing. Told how many
    tokens the reply wants, the call launches exactly the steps that land them; not told, it
    launches one more (in flight when the take said no). Replies as plain steps give."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    prompt = prompts()[0]
    want, _ = serial(model, cfg, prompt, 40)
    for n in (3, 11, 20):
        for left, extra in (([n], 0), (None, 1)):
            s, first = prefilled(model, cfg, prompt)
            d = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0)).drafting
            got = [first]

            def take(t, f, got=got, n=n):
                got.append(t)
                return len(got) <= n

            launched = d.decode([0], [first], [len(prompt)], 40, 400, [take], [3], [None],
                                left=left)  # fmt: skip
            assert launched == d.live_steps[0] + extra
            assert got[: n + 1] == want[: n + 1]


def test_a_graph_replays_only_with_the_buffers_it_was_captured_on(tiny_ckpt):
    """A captured step reads the buffers it was captured on: a call with other buffers of
    the same key (a stale absorber's, as a rebuilt Drafting had: 9a2b8a0) is refused, not
    replayed on memory that may be free."""
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    s, _ = prefilled(model, cfg, prompts()[0])
    driver = LoneDriver(model, [s], drafter=MtpDrafter(model, confidence=0.0))
    io = driver.buffers(1)
    other = copy.copy(io)

    class Graph:
        def replay(self):
            pass

    driver.use_graphs, driver.graphs[io.key(())] = True, (Graph(), io)
    assert driver.runner((), io) is not None
    with pytest.raises(RuntimeError, match="captured on other buffers"):
        driver.runner((), other)
