"""The Triton compile count (flashlane/kernels/compiles.py): it chains the hook it finds."""

from __future__ import annotations

import pytest

from flashlane.kernels import compiles


def test_the_count_chains_a_hook_already_set(monkeypatch):
    knobs = pytest.importorskip("triton").knobs
    seen = []
    monkeypatch.setattr(knobs.runtime, "jit_post_compile_hook", lambda **info: seen.append(info))
    monkeypatch.setattr(compiles, "_installed", False)
    monkeypatch.setattr(compiles, "_count", 0)
    monkeypatch.setattr(compiles, "_recent", [])
    assert compiles.count() == 0
    knobs.runtime.jit_post_compile_hook(key="k", repr="r")  # what Triton calls after a compile
    assert compiles.count() == 1 and seen == [{"key": "k", "repr": "r"}]
    fn = type("Info", (), {"name": "_kernel"})()
    knobs.runtime.jit_post_compile_hook(key="k2", repr="_kernel[num_warps=4](M: i32)", fn=fn)
    assert compiles.since(1) == [("_kernel", "_kernel[num_warps=4](M: i32)")]
    assert compiles.since(2) == [] and len(compiles.since(0)) == 2
