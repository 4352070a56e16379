"""The read ahead (kernels/linear/ahead.py) launches nothing off the GPU: the reference set's
is a no-op, and the Triton one returns at once for a CPU weight (no interpreter run: the
bulk prefetch is a Hopper instruction)."""

import torch

from flashlane.kernels import REFERENCE
from flashlane.kernels.linear import ahead as ahead_mod


def test_ahead_launches_nothing_on_the_cpu(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("launched")

    monkeypatch.setattr(ahead_mod, "_ahead_kernel", type("K", (), {"__getitem__": fail})())
    w = torch.randn(64, 128, dtype=torch.bfloat16)
    assert REFERENCE.ahead(w) is None
    assert ahead_mod.ahead(w) is None
