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
    monkeypatch.setattr(compiles, "_variants", {})
    assert compiles.count() == 0
    knobs.runtime.jit_post_compile_hook(key="k", repr="r")  # what Triton calls after a compile
    assert compiles.count() == 1 and seen == [{"key": "k", "repr": "r"}]
    fn = type("Info", (), {"name": "_kernel"})()
    compiled = {"signature": {"x": "*bf16", "T": "i32", "N": "i32", "BLOCK": "constexpr"},
                "constants": {(2,): 1, (3,): 64}, "configs": [{(0,): [["tt.divisibility", 16]]}],
                "num_warps": 4}  # fmt: skip
    knobs.runtime.jit_post_compile_hook(key="k2", repr="r2", fn=fn, compile=compiled)
    spec = (
        "_kernel warps=4 stages=None constants={'N': 1, 'BLOCK': 64} div16=['x'] "
        "args=x:*bf16,T:i32,N:i32"
    )
    assert compiles.since(1) == [("_kernel", spec)]
    assert compiles.since(2) == [] and len(compiles.since(0)) == 2
    # the same kernel again with x unaligned: what it compiled before is named
    knobs.runtime.jit_post_compile_hook(fn=fn, compile={**compiled, "configs": [{}]})
    other = compiles.since(2)[0][1]
    assert "div16=[]" in other
    assert compiles.earlier("_kernel", other) == [spec] and compiles.earlier("_kernel", spec) == []
    assert compiles.earlier("_none", spec) == []
    knobs.runtime.jit_post_compile_hook(fn=fn, compile=compiled)  # the same specialisation
    assert compiles.earlier("_kernel", spec) == [spec, other]
