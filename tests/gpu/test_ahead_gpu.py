"""A weight read ahead into L2 on a side stream (kernels/linear/ahead.py) changes when bytes
arrive, never what a step computes: graphed lone steps give the same tokens and session
state with FLASHLANE_AHEAD on (1, 2) and off, and the launch takes bf16 and FP8 weights,
eager and captured."""

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


@pytest.mark.parametrize("mode", ["1", "2"])
def test_ahead_on_and_off_give_the_same_bits(monkeypatch, mode):
    monkeypatch.setenv("FLASHLANE_AHEAD", "0")
    off = run(True)
    monkeypatch.setenv("FLASHLANE_AHEAD", mode)
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
    n = w.numel()
    assert calls == [(blocks(2 * n), 2 * n, 0, 0), (blocks(n), n, 0, 0)]
    ahead_mod.ahead(w, w[:64], w[64:128])  # three weights, one launch
    assert calls[-1] == (
        blocks(2 * n, 64 * 6144 * 2, 64 * 6144 * 2),
        2 * n,
        64 * 6144 * 2,
        64 * 6144 * 2,
    )
    graph, out = torch.cuda.CUDAGraph(), {}
    with torch.cuda.graph(graph):
        ahead_mod.ahead(w)
        out["y"] = x @ w.T
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out["y"], want)
    ahead_mod.ahead(w[:, 1:])  # not contiguous: nothing launched
    assert len(calls) == 4


def blocks(*sizes: int) -> tuple[int]:
    span = ahead_mod._CHUNK * ahead_mod._CHUNKS
    return (sum(-(-n // span) for n in sizes),)


class _Counting:
    """The kernel, recording each launch's grid and byte count."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append((grid, args[1], args[3], args[5]))
            return self.kernel[grid](*args, **kw)

        return launch
