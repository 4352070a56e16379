"""A weight read ahead into L2 (kernels/linear/ahead.py) changes when bytes arrive, never
what a step computes: graphed lone steps give the same tokens and session state with
FLASHLANE_AHEAD on and off, and the launch takes bf16 and FP8 weights, eager and captured."""

import pytest
import torch

from flashlane.kernels.linear import ahead as ahead_mod
from flashlane.kernels.linear.fp8 import Fp8Weight
from flashlane.models.fp8 import quantize_blocks
from tests.gpu.test_pdl_gpu import run

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def test_ahead_on_and_off_give_the_same_bits(monkeypatch):
    monkeypatch.setenv("FLASHLANE_AHEAD", "0")
    off = run(True)
    monkeypatch.setenv("FLASHLANE_AHEAD", "1")
    on = run(True)
    assert torch.equal(on[0], off[0])
    assert on[1] == off[1] and on[2] == off[2]
    for a, b in zip(on[3], off[3], strict=True):
        assert torch.equal(a, b)


def test_ahead_launches_for_bf16_and_fp8_weights_eager_and_captured(monkeypatch):
    calls = []
    kernel = ahead_mod._ahead_kernel
    monkeypatch.setattr(ahead_mod, "_ahead_kernel", _Counting(kernel, calls))
    w = torch.randn(2560, 6144, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(1, 6144, device="cuda", dtype=torch.bfloat16)
    want = x @ w.T
    ahead_mod.ahead(w)
    ahead_mod.ahead(Fp8Weight(*quantize_blocks(w)))
    assert len(calls) == 2
    assert calls == [(blocks(w.numel() * 2), w.numel() * 2), (blocks(w.numel()), w.numel())]
    graph, out = torch.cuda.CUDAGraph(), {}
    with torch.cuda.graph(graph):
        ahead_mod.ahead(w)
        out["y"] = x @ w.T
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out["y"], want)
    ahead_mod.ahead(w[:, 1:])  # not contiguous: nothing launched
    assert len(calls) == 3


def blocks(nbytes: int) -> tuple[int]:
    span = ahead_mod._CHUNK * ahead_mod._CHUNKS
    return (-(-nbytes // span),)


class _Counting:
    """The kernel, recording each launch's grid and byte count."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(w, nbytes, **kw):
            self.calls.append((grid, nbytes))
            return self.kernel[grid](w, nbytes, **kw)

        return launch
