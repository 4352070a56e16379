"""Sized sessions on the real backend: moves keep replies exact, a failed move ends one
stream, and the memory plan's byte counts equal the allocated tensors."""

import pytest
import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.models.state import SessionState
from flashlane.planning.memory import session_bytes
from flashlane.request import SamplingParams
from tests import DATA
from tests.oracle import GATE_CHECKPOINTS

COSTS = CostTable({1: 1.0, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)


def ids(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 500, (n,), generator=g).tolist()


@pytest.fixture(scope="module", params=GATE_CHECKPOINTS)
def ckpt(request, oracle_by_name):
    """Flash Next's tiny checkpoint, then each sibling's."""
    return oracle_by_name(request.param)


@pytest.fixture(scope="module")
def sized(ckpt):
    # a small session, two larger ones; the grow margin makes a long reply move up
    return LLM(str(ckpt), costs=COSTS, slot_contexts="40,128x2", slot_grow=8, max_rows=8)


@pytest.fixture(scope="module")
def plain(ckpt):
    return LLM(str(ckpt), costs=COSTS, parallel=1, max_rows=8)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=60, temperature=0.8, seed=3, ignore_eos=True),
    ],
    ids=["greedy", "seeded"],
)
def test_outgrowing_stream_moves_and_stays_exact(sized, plain, params):
    prompts = [ids(10, 1), ids(20, 2), ids(8, 3)]
    outs = sized.generate(prompts, params)
    assert outs[0].stats.moves == 1 and outs[0].stats.pauses >= 1  # waited, then moved
    assert outs[0].stats.preemptions == 1 and outs[0].stats.queue_seconds >= 0
    for p, o in zip(prompts, outs):
        assert o.error is None
        assert o.token_ids == plain.generate(p, params)[0].token_ids


def test_failed_move_ends_only_that_stream(sized, monkeypatch):
    backend = sized.engine.backend

    def broken(stream_id, session_id):
        raise RuntimeError("copy failed")

    monkeypatch.setattr(backend, "move", broken)
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    short = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    outs = sized.generate([ids(10, 1), ids(8, 4)], [params, short])
    assert outs[0].error is not None and "copy failed" in outs[0].error
    assert outs[1].error is None and len(outs[1].token_ids) == 20
    assert not backend.bound


def test_memory_plan_bytes_equal_allocated_tensors(plain):
    cfg = plain.engine.model_config
    for capacity in (64, 96, 512):
        s = SessionState.empty(cfg, capacity, torch.float64, torch.float64)
        assert s.nbytes() == session_bytes(cfg, capacity, 8, 8, mtp=True)
    for s, want in zip(plain.engine.sessions, plain.engine.plan.session_bytes):
        assert s.nbytes() == want


@pytest.mark.parametrize(
    "options, words",
    [
        ({"parallel": 3, "slot_contexts": "64,128"}, ("--parallel 3", "--slot-contexts")),
        ({"context": 100000}, ("--context 100000", "window")),
        ({"max_rows": 2, "mtp_drafts": 3}, ("--max-rows 2", "--mtp-drafts 3")),
    ],
)
def test_options_that_cannot_hold_are_refused(tiny_ckpt, options, words):
    from flashlane.planning.memory import OptionConflict

    with pytest.raises(OptionConflict) as err:
        LLM(str(tiny_ckpt), costs=COSTS, **options)
    assert all(w in str(err.value) for w in words)


def test_info_prints_the_memory_plan(capsys):
    from flashlane.cli import main

    real = DATA / "flashnext_real_config.json"
    assert (
        main(
            [
                "info",
                str(real),
                "--slot-contexts",
                "65536,32768x3,16384x11",
                "--memory-limit-gb",
                "400",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "177,392,830,576" in out and "65536" in out
