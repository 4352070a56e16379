"""kernels/row_kind.py: a forward's rows by kind (decode windows, then prompt pieces), which
the block-FP8 GEMMs' tiles follow; and the backend says so around its forward, for an FP8
model only."""

import threading

import pytest
import torch

from flashlane.kernels import row_kind
from flashlane.lanes.records import Draws, InvalidBatch, Window
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def test_outside_a_forward_every_row_is_a_decode_row():
    assert row_kind.split(7) == [(0, 7, False)]
    assert not row_kind.is_mixed() and row_kind.key() == ()


def test_a_mixed_forward_splits_its_own_rows_and_no_other_count():
    with row_kind.rows(3, 10):
        assert row_kind.is_mixed() and row_kind.key() == ("prompt",)
        assert row_kind.split(10) == [(0, 3, False), (3, 10, True)]
        with pytest.raises(ValueError, match="kinds are unknown"):
            row_kind.split(4)
        with row_kind.uniform(True):
            assert row_kind.split(4) == [(0, 4, True)] and not row_kind.is_mixed()
        with row_kind.uniform(False):
            assert row_kind.split(4) == [(0, 4, False)]
        assert row_kind.split(10) == [(0, 3, False), (3, 10, True)]  # restored
    assert row_kind.split(10) == [(0, 10, False)]


@pytest.mark.parametrize(("prompt_from", "kind"), [(0, True), (6, False)])
def test_a_forward_of_one_kind_is_uniform(prompt_from, kind):
    with row_kind.rows(prompt_from, 6):
        assert not row_kind.is_mixed()
        assert row_kind.split(2) == [(0, 2, kind)]  # any count: every row is of that kind


def test_each_thread_has_its_own_kinds():
    """A server thread's prompt logprobs (server/engine_thread.py) run beside the engine's
    forward: neither sees the other's kinds."""
    seen = []
    with row_kind.rows(3, 10):
        t = threading.Thread(target=lambda: seen.append(row_kind.split(4)))
        t.start()
        t.join()
        assert row_kind.is_mixed()
    assert seen == [[(0, 4, False)]]


def test_rows_out_of_range_and_state_restored_after_an_error():
    with pytest.raises(ValueError, match="prompt rows from 7 of 6"), row_kind.rows(7, 6):
        pass
    with pytest.raises(RuntimeError), row_kind.rows(2, 6):
        raise RuntimeError
    assert row_kind.split(6) == [(0, 6, False)]


def _windows(prompt_len: int, decode_lens: list[int]) -> list[Window]:
    """Decode windows of sessions 1.. (already holding 4 positions), then a prompt piece of
    session 0, in the lane core's order."""
    out = [
        Window(i + 1, i + 1, 4, tuple(range(3, 3 + n)), Draws(GREEDY, 0, [3] * 4, [3]))
        for i, n in enumerate(decode_lens)
    ]
    prompt = list(range(5, 5 + prompt_len))
    return [*out, Window(0, 0, 0, tuple(prompt), Draws(GREEDY, 0, prompt, []), "prompt", True)]


@pytest.fixture(scope="module")
def backend(oracle_ckpt):
    cfg, model = load_checkpoint(oracle_ckpt, dtype=torch.float64)
    sessions = [SessionState.empty(cfg, 64, torch.float64, torch.float64) for _ in range(4)]
    b = ModelBackend(model, sessions, max_rows=16)
    # sessions 1..3 hold a 4-token prompt
    for i in (1, 2, 3):
        w = Window(i, i, 0, (3, 3, 3, 3), Draws(GREEDY, 0, [3] * 4, []), "prompt", True)
        b.verify([w])
        b.keep({i: 4})
    return b


def _seen(backend, monkeypatch, windows) -> list:
    """The runs of one kind the forward's kernels were told (row_kind.split of its rows)."""
    seen, residual = [], backend.model.residual

    def spy(rows):
        seen.append(row_kind.split(rows.token_ids.shape[0]))
        return residual(rows)

    monkeypatch.setattr(backend.model, "residual", spy)
    backend.verify(windows)
    return seen


def test_an_fp8_models_forward_tells_the_kernels_its_prompt_rows(backend, monkeypatch):
    monkeypatch.setattr(backend, "row_kinds", True)  # the FP8 GEMMs read the kinds
    assert _seen(backend, monkeypatch, _windows(5, [1, 3])) == [[(0, 4, False), (4, 9, True)]]
    backend.fed.clear()
    assert _seen(backend, monkeypatch, _windows(5, [])) == [[(0, 5, True)]]
    assert row_kind.split(9) == [(0, 9, False)]  # none after the forward


def test_a_bf16_models_forward_has_one_kind(backend, monkeypatch):
    assert not backend.row_kinds  # no FP8 weights
    assert _seen(backend, monkeypatch, _windows(5, [2])) == [[(0, 7, False)]]


def test_an_fp8_models_verify_refuses_a_prompt_piece_before_a_decode_window(backend, monkeypatch):
    monkeypatch.setattr(backend, "row_kinds", True)
    w = _windows(5, [1])
    with pytest.raises(InvalidBatch, match="decode windows come before prompt pieces"):
        backend.verify([w[1], w[0]])
