"""An FP8 model's forward of decode windows and a prompt piece on the CUDA kernel set (on
the CPU through Triton's interpreter, FP8 weights kept as e4m3): every FP8 linear runs the
decode rows and the prompt rows in a launch each, in each kind's tile (kernels/row_kind.py),
and each window's rows come out as they do alone (bitwise on the GPU, within the
interpreter's dot tolerance on the CPU)."""

import pytest
import torch

from flashlane.lanes.records import Draws, Window
from flashlane.models.fp8_weights import fp8_weights
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from tests.kernels.triton_env import DEVICE, assert_dot_equal, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.gpu import TRITON  # noqa: E402 (after the skip marker)
from flashlane.kernels.linear import triton_fp8  # noqa: E402

GREEDY = SamplingParams(temperature=0.0)


def test_fp8_mixed_forward_splits_every_fp8_linear_by_kind(monkeypatch):
    cfg, model = build_random(
        preset("flashnext-tiny"), torch.float32, DEVICE, 1, quantize="fp8", weights="fp8"
    )
    assert fp8_weights(model)
    model.use_kernels(TRITON)
    sessions = [SessionState.empty(cfg, 128, torch.float32, torch.float32, DEVICE) for _ in "abc"]
    b = ModelBackend(model, sessions, max_rows=64)
    assert b.row_kinds
    p1, p2 = list(range(5, 25)), list(range(30, 70))
    b.verify([Window(1, 1, 0, tuple(p1), Draws(GREEDY, 0, p1, []), "prompt", True)])
    b.keep({1: len(p1)})
    window = Window(1, 1, len(p1), (5, 6), Draws(GREEDY, 0, p1, [5]))
    piece = Window(2, 2, 0, tuple(p2), Draws(GREEDY, 0, p2, []), "prompt", True)

    def rows(windows):
        b.verify(windows)
        return {w.stream_id: b.fed[w.stream_id].residual.clone() for w in windows}

    alone = {**rows([window]), **rows([piece])}
    b.release(2)
    tiles, real = [], triton_fp8.fp8_tile

    def spy(m, n, k, prompt=False):
        tiles.append((m, prompt))
        return real(m, n, k, prompt)

    monkeypatch.setattr(triton_fp8, "fp8_tile", spy)
    both = rows([window, piece])
    assert set(tiles) == {(2, False), (40, True)}
    for sid in (1, 2):
        assert_dot_equal(both[sid], alone[sid], f"stream {sid}")
