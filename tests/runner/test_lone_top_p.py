"""top_p streams on the lone driver on the CPU: a call with a top_p stream runs one step in
flight, and a row the device leaves UNSETTLED is drawn on the host from the step's logits
(lone_draw.KeyedDraw.settle) and fed to the next step before it is launched. Replies equal
shared rounds' token for token: alone, greedy beside top_p, across hand-offs, and with every
top_p row made UNSETTLED (the CPU's draw always settles, so the device's answer is injected);
under TRITON_INTERPRET=1 also through the fused kernels, on rows they cannot call.
"""

import dataclasses
import functools

import pytest
import torch

from flashlane.lanes.records import Draws
from flashlane.request import SamplingParams
from flashlane.runner import lone
from flashlane.runner.lone import LoneDriver
from flashlane.sampling.choose import SampleError
from flashlane.sampling.lone_draw import UNSETTLED, KeyedDraw
from tests.kernels.triton_env import needs_triton
from tests.runner.test_exact import prompts
from tests.runner.test_lone import lone_run, prefilled, with_arrivals, with_lone
from tests.runner.test_lone_sampled import hands_off_and_takes_back, llm, shared  # noqa: F401

SETTLE = KeyedDraw.settle

TOP_P = [
    SamplingParams(max_tokens=30, top_p=0.9, seed=7, draft=False),
    SamplingParams(max_tokens=14, temperature=0.7, top_p=0.5, seed=2**63 + 5, draft=False),
    SamplingParams(max_tokens=25, temperature=1.3, top_k=20, top_p=0.8, seed=123, draft=False),
    SamplingParams(max_tokens=33, temperature=1.0, top_p=0.95, min_p=0.05, seed=99, draft=False),
    SamplingParams(
        max_tokens=20, temperature=1.5, top_k=128, top_p=0.6, min_p=0.01, seed=-3, draft=False
    ),
    SamplingParams(max_tokens=1, temperature=0.9, top_p=0.7, seed=11, draft=False),
]


def lone_replies(llm, ps, params, steps: int, streams: int = 1):  # noqa: F811
    """The replies' tokens with the lone driver on (several streams: together), the driver."""
    if streams > 1:
        return lone_run(
            llm, lambda: [o.token_ids for o in llm.generate(ps, params)], steps, streams
        )
    return lone_run(
        llm, lambda: [llm.generate(p, q)[0].token_ids for p, q in zip(ps, params)], steps
    )


@pytest.mark.parametrize("steps", [1, 6, 32])
def test_top_p_lone_replies_equal_shared_replies(llm, steps):  # noqa: F811
    ps = prompts()[: len(TOP_P)]
    want = [o.token_ids for o in shared(llm, ps, TOP_P)]
    got, driver = lone_replies(llm, ps, TOP_P, steps)
    assert got == want
    assert driver.num_steps >= sum(len(w) - 1 for w in want) - 1  # all lone
    assert any(io.draw is not None and io.draw.may_need_host for io in driver.io.values())


def test_greedy_and_top_p_streams_together_reply_as_shared_rounds(llm):  # noqa: F811
    ps = prompts()[:5]
    greedy = SamplingParams(max_tokens=26, temperature=0.0, draft=False)
    plain = SamplingParams(max_tokens=21, temperature=0.8, seed=4, draft=False)
    params = [greedy, TOP_P[0], plain, TOP_P[2], TOP_P[3]]
    want = [o.token_ids for o in shared(llm, ps, params)]
    got, driver = lone_replies(llm, ps, params, 5, streams=4)
    assert got == want
    assert driver.num_steps > 10 and driver.widest == 4


def test_top_p_lone_hands_off_mid_reply_and_takes_back(llm):  # noqa: F811
    hands_off_and_takes_back(llm, TOP_P[:4])


def unsettle_top_p_rows(monkeypatch) -> list[int]:
    """Every top_p row of a lone keyed step lands as the kernels land a cut they cannot call
    (flag 0, UNSETTLED in the token's place, tok 0); returns the count of settled rows."""
    on_host, settled = KeyedDraw._on_host, [0]

    def unsettled(self, logits, out, tok, pos):
        on_host(self, logits, out, tok, pos)
        for i, s in enumerate(self.specs):
            if s.params.top_p < 1.0 and s.params.temperature > 0 and int(out[i, 1]):
                out[i] = torch.tensor([UNSETTLED, 0])
                tok[i] = 0

    def counted(self, rows, tok, pos, slot=None):
        settled[0] += sum(r == [UNSETTLED, 0] for r in rows)
        return SETTLE(self, rows, tok, pos, slot)

    monkeypatch.setattr(KeyedDraw, "_on_host", unsettled)
    monkeypatch.setattr(KeyedDraw, "settle", counted)
    return settled


def test_unsettled_rows_are_settled_on_the_host_and_fed_to_the_next_step(
    llm,  # noqa: F811
    monkeypatch,
):
    ps = prompts()[:5]
    greedy = SamplingParams(max_tokens=26, temperature=0.0, draft=False)
    params = [TOP_P[0], greedy, TOP_P[2], TOP_P[4], TOP_P[1]]
    want = [o.token_ids for o in shared(llm, ps, params)]
    settled = unsettle_top_p_rows(monkeypatch)
    got, _ = lone_replies(llm, ps[:1], params[:1], 32)
    assert got == want[:1] and settled[0] == len(want[0]) - 1
    got, _ = lone_replies(llm, ps, params, 5, streams=4)
    assert got == want
    driver = with_lone(llm, 3)
    got, _ = with_arrivals(llm, ps[:3], params[:3], 4, interrupt_every=5)
    assert got == want[:3] and driver.num_steps > 0
    # the control: each settled token reported but not fed (tok keeps 0), the reply differs
    monkeypatch.setattr(
        KeyedDraw,
        "settle",
        lambda self, rows, tok, pos, slot=None: SETTLE(self, rows, tok.clone(), pos, slot),
    )
    got, _ = lone_replies(llm, ps[:1], params[:1], 32)
    assert got[0][:2] == want[0][:2] and got != want[:1]


@pytest.mark.parametrize(
    "params,ahead",
    [
        (TOP_P[2], 0),  # one step in flight: none launched past the last one taken
        (dataclasses.replace(TOP_P[2], top_p=1.0), 1),  # two in flight, as before
    ],
)
def test_top_p_calls_run_one_step_in_flight(tiny_ckpt, params, ahead):
    from flashlane.models.loader import load_checkpoint

    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    s, first = prefilled(model, cfg, prompts()[2])
    got = []
    driver = LoneDriver(model, [s])
    launched = driver.decode(
        0,
        first,
        len(prompts()[2]),
        20,
        lambda t, f: bool(got.append(t)) or len(got) < 5,
        -1,
        Draws(params, 5, [], []),
    )
    assert len(got) == 5 + ahead and launched == 5 + ahead == driver.num_steps
    assert s.length == len(prompts()[2]) + launched
    assert not any(isinstance(t, SampleError) for t in got)


def fused_test(f):
    for mark in needs_triton:
        f = mark(f)
    return f


@fused_test
def test_fused_lone_steps_settle_flat_top_p_cuts_on_the_host(llm, monkeypatch):  # noqa: F811
    """Through the fused keyed draw (triton_draw's launches and the landing kernel; on the
    CPU under TRITON_INTERPRET=1): flat fp32 logits put a top_k 128, top_p 0.5 cut's running
    sum exactly on top_p * S, which the kernels never call. The host settles each such row
    from the logits the step kept and the replies equal shared rounds'."""
    model, unsettled = llm.engine.model, [0]
    head = model.head_logits
    monkeypatch.setattr(model, "head_logits", lambda r, xn=None: head(r, xn).float() * 0)
    monkeypatch.setattr(lone, "KeyedDraw", functools.partial(KeyedDraw, fused=True, block=256))

    def counted(self, rows, tok, pos):
        assert self.fused and self.logits is self.held
        unsettled[0] += sum(r == [UNSETTLED, 0] for r in rows)
        return SETTLE(self, rows, tok, pos)

    monkeypatch.setattr(KeyedDraw, "settle", counted)
    params = [
        SamplingParams(max_tokens=12, top_k=128, top_p=0.5, seed=1, draft=False),
        SamplingParams(max_tokens=10, temperature=0.8, top_p=0.9, seed=2, draft=False),
        SamplingParams(max_tokens=8, temperature=0.0, draft=False),
    ]
    ps = prompts()[:3]
    want = [o.token_ids for o in shared(llm, ps, params)]
    got, driver = lone_replies(llm, ps, params, 6, streams=3)
    assert got == want and driver.num_steps > 0
    assert unsettled[0] > 0  # every lone step of the first stream
