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
    assert compiles.count() == 0
    knobs.runtime.jit_post_compile_hook(key="k", repr="r")  # what Triton calls after a compile
    assert compiles.count() == 1 and seen == [{"key": "k", "repr": "r"}]
