"""Exactness gates on the real backend (tiny oracle checkpoints with random mtp.* weights:
Flash Next's and each sibling's): verify widths with rejected drafts, shared rounds vs
alone, drafted vs not, errors."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CostTable, Draws, Window
from flashlane.llm import LLM
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from tests.oracle import GATE_CHECKPOINTS, SIBLINGS

COSTS = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)
SEEDED = SamplingParams(max_tokens=24, temperature=0.9, top_p=0.95, seed=11)
KINDS = (
    "attention k, v", "indexer keys", "pooled block keys", "gdn recurrent", "gdn conv",
    "ple conv", "ple ids",
)  # fmt: skip


@pytest.fixture(scope="module", params=GATE_CHECKPOINTS)
def llm(request, oracle_by_name):
    return LLM(str(oracle_by_name(request.param)), costs=COSTS, parallel=8, max_rows=16)


def prompts():
    g = torch.Generator().manual_seed(5)
    lens = [5, 70, 17, 130, 9, 64, 33, 3]
    return [torch.randint(3, 500, (n,), generator=g).tolist() for n in lens]


def serial(model, cfg, prompt, n):
    """Greedy one-row decoding: the reference every drafted or shared run must equal."""
    s = SessionState.empty(cfg, 512, torch.float64, torch.float64)
    b = ModelBackend(model, [s], max_rows=16)
    draws = Draws(GREEDY, 0, prompt, [])
    v = b.verify([Window(0, 0, 0, tuple(prompt), draws, kind="prompt", last_piece=True)])
    b.keep({0: len(prompt)})
    out = [v[0].sampled[0]]
    while len(out) < n:
        v = b.verify(
            [
                Window(
                    0,
                    0,
                    len(prompt) + len(out) - 1,
                    (out[-1],),
                    Draws(GREEDY, 0, prompt, list(out)),
                )
            ]
        )
        b.keep({0: 1})
        out.append(v[0].sampled[0])
    return out, s


def state_kinds(s: SessionState) -> dict[str, list[torch.Tensor]]:
    """Every tensor the session reads back, by state kind: caches up to its length (pooled
    block keys up to its complete blocks), the whole recurrent, conv and PLE state. A kind
    the model does not have (a sibling's indexer and PLE: zero-width tensors) is left out."""
    n, kinds = s.length, {}

    def add(kind: str, *tensors: torch.Tensor) -> None:
        kinds.setdefault(kind, []).extend(t for t in tensors if t.numel())

    for c in s.attn.values():
        blocks = n // (c.k.shape[0] // max(1, c.block_keys.shape[0]))
        add("attention k, v", c.k[:n], c.v[:n])
        add("indexer keys", c.index_keys[:n])
        add("pooled block keys", c.block_keys[:blocks])
    for g in s.gdn.values():
        add("gdn recurrent", g.recurrent)
        add("gdn conv", g.conv)
    for q in s.ple.values():
        add("ple conv", q.conv)
        add("ple ids", q.ids)
    return {k: v for k, v in kinds.items() if v}


@pytest.fixture(scope="module")
def serial_runs(oracle_by_name):
    """Per checkpoint name: the model and the serial run every width must end equal to."""
    runs = {}

    def run(name):
        if name not in runs:
            cfg, model = load_checkpoint(oracle_by_name(name), dtype=torch.float64)
            runs[name] = (cfg, model, *serial(model, cfg, prompts()[2], 40))
        return runs[name]

    return run


@pytest.mark.parametrize("name, width", [
    *(("tiny", w) for w in range(1, 17)),
    *((name, w) for name in sorted(SIBLINGS) for w in (3, 16)),
])  # fmt: skip
def test_verify_width_with_rejected_drafts_equals_serial(serial_runs, name, width):
    cfg, model, want, ref_session = serial_runs(name)
    prompt, n = prompts()[2], len(want)
    s = SessionState.empty(cfg, 512, torch.float64, torch.float64)
    b = ModelBackend(model, [s], max_rows=16)
    v = b.verify([Window(0, 0, 0, tuple(prompt), Draws(GREEDY, 0, prompt, []), "prompt", True)])
    b.keep({0: len(prompt)})
    got, calls = [v[0].sampled[0]], 0
    while len(got) < n:
        start = len(prompt) + len(got) - 1
        # drafts stop at the serial run's length, so the session ends where the serial one does
        drafts = list(want[len(got) : min(len(got) + width - 1, n - 1)])
        calls += 1
        if calls % 3 == 0 and drafts:  # a wrong draft every third window
            drafts[len(drafts) // 2] = (drafts[len(drafts) // 2] + 1) % cfg.vocab_size
        w = Window(0, 0, start, (got[-1], *drafts), Draws(GREEDY, 0, prompt, list(got)))
        sampled = b.verify([w])[0].sampled
        kept = 1
        while kept < w.num_rows and w.tokens[kept] == sampled[kept - 1]:
            kept += 1
        b.keep({0: kept})
        got += sampled[:kept]
    assert got == want
    assert s.length == ref_session.length == len(prompt) + n - 1
    kinds, ref_kinds = state_kinds(s), state_kinds(ref_session)
    assert set(kinds) == set(ref_kinds)
    # the tiny checkpoint has every kind; a sibling has attention and GDN state
    has = set(KINDS) if name == "tiny" else {"attention k, v", "gdn recurrent", "gdn conv"}
    assert set(kinds) >= has
    for kind in kinds:
        assert len(kinds[kind]) == len(ref_kinds[kind]) > 0, kind
        for a, r in zip(kinds[kind], ref_kinds[kind]):
            assert a.numel() > 0, kind
            torch.testing.assert_close(a, r, rtol=1e-12, atol=1e-12, msg=kind)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_shared_rounds_equal_alone(llm, params):
    ps = prompts()
    plist = [dataclasses.replace(params, draft=(i % 3 != 1)) for i in range(len(ps))]
    together = llm.generate(ps, plist)
    for prompt, p, got in zip(ps, plist, together):
        alone = llm.generate(prompt, dataclasses.replace(p, draft=False))[0]
        assert got.token_ids == alone.token_ids
        assert got.error is None


@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
def test_copy_and_mtp_drafts_are_used(oracle_by_name, name):
    # a fresh engine: its random head's misses on the other tests' streams make a landing so
    # unlikely that the depth rule would not pay for a fresh stream's catch-up
    llm = LLM(str(oracle_by_name(name)), costs=COSTS, parallel=8, max_rows=16)
    rep = [7, 8, 9, 10, 11, 12] * 12
    out = llm.generate(rep, SamplingParams(max_tokens=40, temperature=0.0))[0]
    alone = llm.generate(rep, SamplingParams(max_tokens=40, temperature=0.0, draft=False))[0]
    assert out.token_ids == alone.token_ids
    assert out.stats.drafted > 0


def test_injected_backend_error_ends_only_that_round(llm, monkeypatch):
    backend = llm.engine.backend
    real = backend.verify
    calls = {"n": 0}

    def flaky(windows):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected")
        return real(windows)

    monkeypatch.setattr(backend, "verify", flaky)
    outs = llm.generate(prompts()[:3], GREEDY)
    assert any(o.error and "injected" in o.error for o in outs)
    monkeypatch.setattr(backend, "verify", real)
    assert not backend.bound  # every session came back
    # past any EOS: a checkpoint whose reply ends early would say nothing here
    again = llm.generate(prompts()[0], dataclasses.replace(GREEDY, ignore_eos=True))[0]
    assert again.error is None and len(again.token_ids) == GREEDY.max_tokens
