"""A new stream's whole short prompt through runner/fresh.py (one CUDA graph per length on a
GPU; here the same work eagerly): the scratch session's state copied into the stream's
session at keep must be the state the eager round leaves, and the round's rows, logits and
replies those of the eager round, bit for bit (float64 on the CPU). tests/gpu/
test_fresh_gpu.py replays the graphs."""

import pytest
import torch

from flashlane.lanes.records import Draws, Window
from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from flashlane.runner.fresh import ROWS, FreshPrompts
from tests.runner.test_lone import state_of
from tests.sweep_gates import COSTS

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module", params=["tiny", "other", "qwen3_next"])
def model(request, oracle_by_name):
    return load_checkpoint(oracle_by_name(request.param), dtype=torch.float64)


def _backend(cfg, model, fresh: bool, kv8: bool = False) -> ModelBackend:
    f64 = torch.float64
    sessions = [SessionState.empty(cfg, 256, f64, f64, kv_fp8=kv8) for _ in range(2)]
    b = ModelBackend(model, sessions, max_rows=16, max_prompt_rows=512)
    if fresh:
        b.fresh = FreshPrompts(model, sessions[0], graphed=False)
    return b


def _prompt(sid: int, tokens, start: int = 0, last: bool = True) -> Window:
    return Window(
        sid, sid, start, tuple(tokens), Draws(GREEDY, 0, list(tokens), []), "prompt", last
    )


@pytest.mark.parametrize("n,kv8", [(1, False), (7, False), (33, False), (ROWS, False), (33, True)])
def test_a_fresh_prompt_leaves_the_eager_rounds_state_and_rows(model, n, kv8):
    """kv8: 8-bit caches (--kv-cache-dtype fp8), their values copied as bytes."""
    cfg, m = model
    prompt = [(5 + 13 * i) % cfg.vocab_size for i in range(n)]
    eager, fresh = _backend(cfg, m, False, kv8), _backend(cfg, m, True, kv8)
    assert fresh.fresh.scratch.kv_fp8 == kv8
    got = {}
    for name, b in (("eager", eager), ("fresh", fresh)):
        for sid in (0, 1):  # two streams in turn: the scratch is reused
            verdict = b.verify([_prompt(sid, prompt[sid:] + prompt[:sid])])[0]
            rows = b.fed[sid].residual.clone()
            b.keep({sid: n})
            nxt = b.verify(
                [Window(sid, sid, n, (verdict.sampled[0],), Draws(GREEDY, 0, prompt, []))]
            )
            got[name, sid] = (verdict.sampled, rows, b.fed[sid].residual.clone())
            b.keep({sid: 1})
            got[name, sid] += (nxt[0].sampled, state_of(b.sessions[sid]))
    assert fresh.fresh.num_runs == 2
    for sid in (0, 1):
        (a_tok, a_rows, a_next, a_after, a_state), (b_tok, b_rows, b_next, b_after, b_state) = (
            got["eager", sid],
            got["fresh", sid],
        )
        assert a_tok == b_tok and a_after == b_after
        assert torch.equal(a_rows, b_rows) and torch.equal(a_next, b_next)
        assert len(a_state) == len(b_state)
        assert all(torch.equal(x, y) for x, y in zip(a_state, b_state))


def replays_pay(fresh: FreshPrompts, pays: bool = True) -> None:
    """Replays priced below (above) every eager round of several fresh prompts."""
    fresh.replay_ms = dict.fromkeys(range(1, ROWS + 1), 0.5)
    fresh.eager_ms = dict.fromkeys(range(2, 9), 100.0 if pays else 0.1)


def test_which_rounds_replay(model, monkeypatch):
    """A whole short prompt alone; several, where their replays cost less GPU time than an
    eager round of as many took host time at least (measured by the eager rounds themselves,
    but not by one that compiled kernels)."""
    cfg, m = model
    b = _backend(cfg, m, True)
    prompt = [(3 + 7 * i) % cfg.vocab_size for i in range(ROWS + 1)]
    two = [_prompt(0, prompt[:5]), _prompt(1, prompt[:6])]
    assert not b.fresh.takes([_prompt(0, prompt)])  # too long
    assert not b.fresh.takes([_prompt(0, prompt[:64], last=False)])  # a long prompt's piece
    assert not b.fresh.takes(two)  # no eager round of two measured yet
    b.verify(two)  # one, eager: it measures
    assert set(b.fresh.eager_ms) == {2} and b.fresh.num_runs == 0
    replays_pay(b.fresh, pays=False)
    assert not b.fresh.takes(two)
    replays_pay(b.fresh)
    assert b.fresh.takes(two)
    assert not b.fresh.takes([two[0], _prompt(1, prompt[:64], last=False)])  # one is not whole
    assert not b.fresh.takes([_prompt(0, prompt[4:9], start=4)])  # a resumed prompt
    assert b.fresh.takes([_prompt(0, prompt[:ROWS])])
    b = _backend(cfg, m, True)
    b.fresh.eager_ms = {2: 1e-6}
    b.verify(two)  # the least stays
    assert b.fresh.eager_ms == {2: 1e-6}
    b = _backend(cfg, m, True)
    counts = iter(range(100))
    monkeypatch.setattr("flashlane.runner.fresh.compiles.count", lambda: next(counts))
    b.verify(two)  # compiled (as a first round of new shapes may): no price
    assert b.fresh.eager_ms == {}
    monkeypatch.undo()
    b = _backend(cfg, m, True)
    b.verify([_prompt(0, prompt[:9])])
    with pytest.raises(ValueError, match="keeps all"):  # no state a row to roll back to
        b.keep({0: 9 - 1})


def test_fresh_prompts_together_leave_each_ones_eager_state_and_rows(model):
    """A round of several fresh whole prompts replayed one after the other (the scratch
    reused): each session's state, rows and draw are those of an eager round of its prompt
    alone, bit for bit, and those of the eager round of them together within float64's
    rounding (the CPU's products are not row invariant; tests/gpu/test_fresh_gpu.py holds
    the GPU's rounds to the bit)."""
    cfg, m = model
    lengths = (9, 1, 33)
    prompts = [[(5 + 13 * i + k) % cfg.vocab_size for i in range(n)] for k, n in enumerate(lengths)]

    def rounds(fresh: bool, together: bool) -> list:
        b = _backend(cfg, m, fresh)
        b.sessions.append(SessionState.empty(cfg, 256, torch.float64, torch.float64))
        if fresh:
            replays_pay(b.fresh)
        groups = [list(enumerate(prompts))] if together else [[x] for x in enumerate(prompts)]
        out = []
        for group in groups:
            verdicts = b.verify([_prompt(sid, p) for sid, p in group])
            rows = [b.fed[sid].residual.clone() for sid, _ in group]
            b.keep({sid: len(p) for sid, p in group})
            out += [(v.sampled, r) for v, r in zip(verdicts, rows)]
        assert not fresh or b.fresh.num_runs == 1
        return [(*o, state_of(s)) for o, s in zip(out, b.sessions)]

    got, alone, eager = rounds(True, True), rounds(False, False), rounds(False, True)
    for (tok, rows, state), (a_tok, a_rows, a_state), (e_tok, e_rows, e_state) in zip(
        got, alone, eager
    ):
        assert tok == a_tok == e_tok and len(state) == len(a_state) == len(e_state)
        assert torch.equal(rows, a_rows) and torch.allclose(rows, e_rows, rtol=0, atol=1e-12)
        assert all(torch.equal(x, y) for x, y in zip(state, a_state))
        assert all(torch.allclose(x, y, rtol=0, atol=1e-12) for x, y in zip(state, e_state))


def test_replies_through_fresh_prompts_are_those_of_eager_rounds(tiny_ckpt):
    """Greedy and seeded replies, drafting on, one stream and three: the fresh path's rows
    feed the MTP head's cells too."""
    prompts = [[(11 + 17 * i + 5 * k) % 512 for i in range(5 + 9 * k)] for k in range(3)]
    params = [
        SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=12, temperature=0.9, seed=7, ignore_eos=True),
    ]
    llm = LLM(str(tiny_ckpt), costs=COSTS, parallel=4, max_rows=16)
    want = [
        [o.token_ids for o in llm.generate(ps, p)] for p in params for ps in (prompts[:1], prompts)
    ]
    b = llm.engine.backend
    b.fresh = FreshPrompts(llm.engine.model, llm.engine.sessions[0], graphed=False)
    replays_pay(b.fresh)  # the three prompts' rounds too
    got = [
        [o.token_ids for o in llm.generate(ps, p)] for p in params for ps in (prompts[:1], prompts)
    ]
    assert b.fresh.num_runs >= 4  # the lone prompts and the rounds of three
    assert got == want
