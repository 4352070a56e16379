"""Warm rounds before a server listens (lanes/warm_start.py): waves of short requests
arriving together at each lone size, greedy and sampled, leaving the host as it found it."""

import types

import pytest

from flashlane.lanes.stream import DraftStats
from flashlane.lanes.warm_start import LONG, TOKENS, _lengths, warm_start, wave_sizes
from flashlane.request import SamplingParams
from tests.lanes.fake import NUM_IDS, FakeBackend, hash_model, make_host, run_to_end, serial


class CountingBackend(FakeBackend):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.pieces: list[int] = []  # prompt pieces per verify
        self.rounds: list[list] = []  # (kind, start, rows, last piece) of each verify's windows

    def verify(self, windows):
        self.pieces.append(sum(1 for w in windows if w.kind == "prompt"))
        self.rounds.append([(w.kind, w.start, w.num_rows, w.last_piece) for w in windows])
        return FakeBackend.verify(self, windows)


def test_waves_at_each_lone_size_up_to_the_sessions():
    host = make_host(FakeBackend(), num_sessions=5)
    assert wave_sizes(host) == [1, 2, 4]
    host.lone = types.SimpleNamespace(sizes=[1, 2, 4, 8, 16])
    assert wave_sizes(host) == [1, 2, 4, 5]


def test_prompts_of_a_wave_fit_one_round_in_both_specialisations():
    for size, budget in [(1, 1024), (4, 1024), (16, 1024), (64, 1024), (16, 64)]:
        odd, sixteens = _lengths(size, budget), _lengths(size, budget, 16)
        assert len(odd) == size == len(sixteens)
        assert sum(odd) <= budget and sum(sixteens) <= budget
        assert all(n % 2 == 1 for n in odd) and (size == 1 or odd[-1] == 1)
        top = min(63, budget // size - 1)
        if top >= 16:
            assert all(n % 16 == 0 and n >= 16 for n in sixteens)
        else:  # no multiple of 16 fits: odd lengths again
            assert all(n % 2 == 1 for n in sixteens)
    assert _lengths(4, 1024) == [63, 61, 59, 1]
    assert _lengths(4, 1024, 16) == [48, 32, 16, 48]


def test_warm_rounds_leave_the_host_idle_and_replies_unchanged():
    backend = CountingBackend()
    host = make_host(backend, num_sessions=4, prefill_rows=1024)
    seconds = warm_start(host, NUM_IDS + 10)
    assert seconds >= 0.0 and not host.has_work
    assert max(backend.pieces) == 4  # four prompts' pieces in one round
    assert host.sessions.num_free == 4
    assert host.counts == dict.fromkeys(host.counts, 0)
    assert host.clock.plain is None and host.clock.per_row is None
    assert host.core.mtp_pool == DraftStats()
    prompt = [11, 12, 13, 14]
    host.submit("real", prompt, SamplingParams(max_tokens=12, temperature=0.0))
    host.submit("seeded", prompt, SamplingParams(max_tokens=12, temperature=1.0), seed=5)
    outs = run_to_end(host)
    assert outs["real"].token_ids == serial(hash_model, prompt, None, 12)
    assert outs["seeded"].token_ids == serial(hash_model, prompt, 5, 12)


def test_a_busy_host_is_refused():
    host = make_host(FakeBackend())
    host.submit("live", [11, 12], SamplingParams(max_tokens=2, temperature=0.0))
    with pytest.raises(ValueError, match="idle"):
        warm_start(host, NUM_IDS + 10)


def test_short_sessions_and_a_short_queue_bound_the_waves():
    backend = CountingBackend(capacities=(24,) * 4)
    host = make_host(backend, num_sessions=4, max_queue=2)
    warm_start(host, NUM_IDS + 10)
    assert not host.has_work and host.sessions.num_free == 4
    assert max(backend.pieces) == 2  # waves of 1 and 2: the queue holds two


def test_a_wave_that_fails_leaves_the_host_idle():
    backend = CountingBackend()
    host = make_host(backend, num_sessions=4)
    real = host.run_once
    calls = []

    def failing():
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("boom")
        return real()

    host.run_once = failing
    with pytest.raises(RuntimeError, match="boom"):
        warm_start(host, NUM_IDS + 10)
    assert not host.has_work and host.sessions.num_free == 4


def test_the_lone_drivers_drafting_starts_afresh_on_its_own_buffers():
    """The same Drafting, its measures, landing and carries forgotten, its absorber kept: the
    driver's absorb graphs, captured at engine start, read that absorber's buffers (a new
    Drafting dropped them, and a drafted call's absorb then read freed memory)."""
    from flashlane.runner.lone_draft import Drafting

    host = make_host(FakeBackend(capacities=(4, 4)), num_sessions=2)
    assert host.sessions.max_model_len <= TOKENS  # no wave fits: only the resets run
    drafting = Drafting(types.SimpleNamespace(), depth=2)
    absorber, io = drafting.absorber, drafting.absorber.io
    io[8] = "the captured bucket's buffers"
    drafting.stats.offered.append(3)
    drafting.num_calls, drafting.carry[7], drafting.best = 5, "device drafts", 2
    host.lone = types.SimpleNamespace(drafting=drafting, sizes=[1, 2])
    host.core.mtp_pool.offered.append(3)
    warm_start(host, NUM_IDS + 10)
    assert host.core.mtp_pool == DraftStats()
    assert host.lone.drafting is drafting and drafting.absorber is absorber
    assert absorber.io is io and io[8] == "the captured bucket's buffers"
    assert drafting.stats == DraftStats() and drafting.num_calls == 0
    assert drafting.carry == {} and drafting.best is None and drafting.depth == 2


def test_warm_rounds_meet_chunked_prompts_together_and_beside_a_reply():
    """Past LONG rows a prompt takes the chunked GDN call (fla's kernels on a GPU), whose
    specialisations the short waves never meet; served at 16 on the H100 four of them
    compiled in a 2-3 s round (serve_cuda_h100_eda8d35_*). So the warm rounds run several
    whole long prompts in one round, a long prompt arriving while a reply decodes, whose
    pieces the clock cuts (one that starts from a kept state, then its last), and a prompt
    whose last piece is one row."""
    backend = CountingBackend()
    host = make_host(backend, num_sessions=4, prefill_rows=1024)
    warm_start(host, NUM_IDS + 10)
    together = [
        r for r in backend.rounds
        if sum(1 for k, start, n, last in r if k == "prompt" and start == 0 and last and n > LONG)
        >= 3
    ]  # fmt: skip
    cut = [
        r for r in backend.rounds
        if any(k == "decode" for k, *_ in r)
        and any(k == "prompt" and start > 0 for k, start, *_ in r)
    ]  # fmt: skip
    assert together and cut
    # a prompt of a round's rows and one more: its last piece a row, from a kept state
    assert any(r == [("prompt", 1024, 1, True)] for r in backend.rounds)
    assert not host.has_work and host.sessions.num_free == 4
    from flashlane.models.layers.gated_deltanet import SHORT_PROMPT

    assert LONG == SHORT_PROMPT


def test_each_size_warms_greedy_sampled_and_host_drawn_steps():
    """Every wave size runs greedy, keyed and penalized requests: a penalized step keeps its
    logits in fp32 for the host's draw, a variant of the landing kernel of its own (served
    at 16 on the H100 it compiled while serving, serve_cuda_h100_66fe4d1_*)."""
    from flashlane.sampling.kinds import GREEDY, OTHER, PLAIN, row_kind

    host = make_host(FakeBackend(), num_sessions=4, prefill_rows=1024)
    submitted = []
    submit = host.submit

    def recording(request_id, prompt, params, **kw):
        submitted.append((request_id, row_kind(params)))
        return submit(request_id, prompt, params, **kw)

    host.submit = recording
    warm_start(host, NUM_IDS + 10)
    for size in wave_sizes(host):
        kinds = [k for rid, k in submitted if rid.startswith(f"warm-{size}-")]
        assert kinds.count(GREEDY) == kinds.count(PLAIN) == kinds.count(OTHER) == size
