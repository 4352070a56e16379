"""The lone driver for the siblings (Qwen3-Next, Qwen3.5, Qwen3.5-MoE) on the CPU: a plain
step (runner/lone_step.plain_step) leaves a session bit for bit where shared one-row rounds
leave it, sessions stepped together decode as each alone, and through the host the replies
with the driver equal shared rounds' (greedy, drafting, sampled)."""

import dataclasses

import pytest
import torch

from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.models.rows import Rows
from flashlane.request import SamplingParams
from flashlane.runner.lone import LoneDriver
from flashlane.runner.lone_step import plain_step
from tests.runner.test_exact import COSTS, prompts, serial
from tests.runner.test_lone import (
    GREEDY,
    assert_same_states,
    lone_run,
    prefilled,
    state_of,
    without_lone,
)


@pytest.fixture(scope="module")
def sibling(sibling_ckpt):
    cfg, model = load_checkpoint(sibling_ckpt, dtype=torch.float64)
    return sibling_ckpt, cfg, model


def test_plain_steps_equal_shared_rounds_bit_for_bit(sibling):
    _, cfg, model = sibling
    prompt = prompts()[3]
    want, ref = serial(model, cfg, prompt, 24)
    s, first = prefilled(model, cfg, prompt)
    assert first == want[0]
    got = [first]
    driver = LoneDriver(model, [s])
    assert driver.drafting is None  # drafted steps are Flash Next's

    def take(token, finite):
        assert finite
        got.append(token)
        return True

    n = driver.decode(0, got[-1], len(prompt), 9, take)
    n += driver.decode(0, got[-1], len(prompt) + n, 14, take)
    assert n == 23 and got == want
    assert_same_states([s], [ref])


def test_plain_step_row_is_the_shared_rounds_residual(sibling):
    """The row a plain step records (the final norm's output: its logits' input and its MTP
    head's) is bitwise the residual a shared round computes for the same token at the same
    position on a twin session; the last layer's attention counts here (the states above
    cannot show it where an attention layer is the last)."""
    _, cfg, model = sibling
    prompt = prompts()[3]
    (a, first), (b, _) = prefilled(model, cfg, prompt), prefilled(model, cfg, prompt)
    tok, pos = torch.tensor([first]), torch.tensor([len(prompt)])
    out, rows = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 1, cfg.hidden_size).double()
    plain_step(model, [a], tok, pos, out, (rows, torch.zeros(1, dtype=torch.long)))
    want = model.residual(Rows.of([(b, [first], len(prompt), True)], "cpu"))
    assert torch.equal(rows[0], want)
    assert int(out[0, 0]) == int(model.logits(want).argmax())


def test_sibling_sessions_together_equal_each_alone(sibling):
    """Three sessions of different lengths in lockstep (their attention per session's cache,
    the rest batched): each one's tokens are its own alone; states to 1e-12 (the CPU's fp64
    GEMM may round a batched row's last bit differently: the GPU's is row-invariant)."""
    _, cfg, model = sibling
    ps = [prompts()[i] for i in (0, 1, 3)]
    sessions, refs, wants, got = [], [], [], []
    for p in ps:
        want, ref = serial(model, cfg, p, 16)
        s, first = prefilled(model, cfg, p)
        sessions.append(s)
        refs.append(ref)
        wants.append(want)
        got.append([first])
    driver = LoneDriver(model, sessions)

    def take_for(i):
        return lambda token, finite: bool(got[i].append(token)) or True

    order = [2, 0, 1]
    n = driver.decode_many(
        order, [got[i][-1] for i in order], [len(ps[i]) for i in order], 15,
        [take_for(i) for i in order], [-1] * 3, [None] * 3,
    )  # fmt: skip
    assert n == 15 and got == wants and driver.widest == 3
    for s, ref in zip(sessions, refs):
        assert s.length == ref.length
        for a, b in zip(state_of(s), state_of(ref)):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("draft", [False, True])
def test_sibling_replies_on_the_lone_driver_equal_shared_rounds(sibling, draft):
    """Four streams together on the lone driver, five requests of different lengths (one
    ends inside a burst, one waits for a stream to leave), one sampled: the replies equal
    shared rounds'; drafting streams step plainly there, their cells queued for their MTP
    head."""
    path = sibling[0]
    llm = LLM(str(path), costs=COSTS, parallel=8, max_rows=16)
    ps = prompts()[:5]
    params = [dataclasses.replace(GREEDY, max_tokens=m, draft=draft) for m in (30, 7, 25, 1, 20)]
    params[2] = SamplingParams(max_tokens=25, temperature=0.8, seed=11, draft=draft)
    without_lone(llm)
    want = [o.token_ids for o in llm.generate(ps, params)]
    got, driver = lone_run(
        llm, lambda: [o.token_ids for o in llm.generate(ps, params)], 6, streams=4
    )
    assert got == want
    assert driver.num_steps > 10 and driver.widest == 4
