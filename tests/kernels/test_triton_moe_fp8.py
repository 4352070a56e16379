"""The Triton MoE over block-FP8 expert stacks (kernels/moe/triton_fp8.py): against the
reference (which dequantizes the stacks), and row invariance, test_triton_moe.py's pattern.
The stacks are real e4m3 tensors with float32 block scales (the interpreter loads and
converts e4m3 exactly: test_triton_fp8.py); shapes with two K blocks and partial blocks.
Tolerances: test_triton_moe.py's (fp32 1e-5, bf16 3e-2 against the bf16 reference).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_moe_fp8.py`.
"""

from __future__ import annotations

import functools

import pytest
import torch

from flashlane.kernels import row_kind
from flashlane.kernels.linear.fp8 import Fp8Weight, cat_stack
from flashlane.models.fp8 import quantize_blocks
from tests.kernels.test_triton_dense import _check_other_rows, _check_rows, _rand, _rel_err
from tests.kernels.test_triton_fp8 import _act_ref
from tests.kernels.triton_env import DEVICE, DTYPES, HAS_CUDA, assert_dot_equal, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.moe import reference as moe_ref  # noqa: E402
from flashlane.kernels.moe import triton as dense_moe  # noqa: E402
from flashlane.kernels.moe import triton_fp8 as tmoe  # noqa: E402

MOE_TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
# prompt rows against _prompt_ref: an intermediate a rounding apart can take the next e4m3
# code (a step of 2^-3 in that value)
# In bf16 the SwiGLU's output is rounded to bf16 before its block-FP8 quantization, whose
# scale follows each 128-group's amax: one bf16 ulp there moves every code of the group.
# Nudging 1-100% of the reference's own h by one ulp moves it 2.3-3.2% (max error over the
# largest output); the kernel's fp32 sums differ from float64's by such ulps, and the H200
# gave 4.7% at SMALL (2026-12-05, 997cb52). float32 keeps the tight check of the arithmetic.
PROMPT_TOL = {torch.float32: 1e-4, torch.bfloat16: 6e-2}
# (H, E, I, top_k): two K blocks in each product, partial edge blocks
SMALL = (160, 6, 136, 3)
CASES = [(SMALL, dt) for dt in DTYPES] + (
    [((2560, 64, 640, 10), torch.bfloat16)] if HAS_CUDA else []
)


def _fp8(*shape, seed):
    w = _rand(*shape, scale=shape[-1] ** -0.5, seed=seed)
    return Fp8Weight(*quantize_blocks(w.cpu()))


@functools.cache
def _weights(h, e, i, dtype, seed=40):
    router = _rand(e, h, scale=h**-0.5, seed=seed).to(dtype)
    gate, up = _fp8(e, i, h, seed=seed + 1), _fp8(e, i, h, seed=seed + 2)
    down = _fp8(e, h, i, seed=seed + 3)
    return router, *(w.to(DEVICE) for w in (gate, up, down))


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("m", [1, 3, 17, 65])
def test_moe_fp8_matches_reference(m, case, normalize):
    (h, e, i, k), dtype = case
    router, gate, up, down = _weights(h, e, i, dtype)
    x = _rand(m, h, dtype=dtype, seed=41)
    out = tmoe.moe(x, router, gate, up, down, k, normalize)
    assert out.dtype == dtype and out.shape == x.shape
    want = moe_ref.moe(x, router, gate, up, down, k, normalize)
    assert _rel_err(out, want) < MOE_TOL[dtype]


@pytest.mark.parametrize("case", CASES, ids=str)
def test_moe_fp8_with_the_shared_expert(case):
    """The shared expert as its own add (moe's `shared`) and as one more expert of the
    stacks (moe_shared): both near the reference, and rows alone give the call's bits."""
    (h, e, i, k), dtype = case
    router, gate, up, down = _weights(h, e, i, dtype)
    x = _rand(33, h, dtype=dtype, seed=42)
    logits = _rand(33, 3, dtype=dtype, seed=43)[:, 1:2]
    s = _rand(33, h, dtype=dtype, seed=44)
    got = tmoe.moe(x, router, gate, up, down, k, True, (logits, s))
    want = moe_ref.moe(x, router, gate, up, down, k, True, (logits, s))
    assert _rel_err(got, want) < MOE_TOL[dtype]
    sr = _rand(1, h, dtype=dtype, scale=h**-0.5, seed=45)
    sg, su = (_fp8(i, h, seed=sd).to(DEVICE) for sd in (46, 47))
    sd = _fp8(h, i, seed=48).to(DEVICE)
    r1 = torch.cat([router, sr])
    g1, u1, d1 = cat_stack(gate, sg), cat_stack(up, su), cat_stack(down, sd)
    both = tmoe.moe_shared(x, r1, g1, u1, d1, k, True)
    assert _rel_err(both, moe_ref.moe_shared(x, r1, g1, u1, d1, k, True)) < MOE_TOL[dtype]
    for o, m in ((0, 1), (5, 7), (20, 13)):
        part = (logits[o : o + m], s[o : o + m])
        assert_dot_equal(
            tmoe.moe(x[o : o + m], router, gate, up, down, k, True, part), got[o : o + m]
        )
        assert_dot_equal(tmoe.moe_shared(x[o : o + m], r1, g1, u1, d1, k, True), both[o : o + m])


@pytest.mark.parametrize("case", CASES, ids=str)
def test_moe_fp8_row_invariant(case):
    (h, e, i, k), dtype = case
    router, gate, up, down = _weights(h, e, i, dtype)
    full = _rand(150 if HAS_CUDA else 24, h, dtype=dtype, seed=49)
    fn = lambda x: tmoe.moe(x, router, gate, up, down, k, True)  # noqa: E731
    _check_rows(fn, full, m_sweep=[*range(1, 18)] if HAS_CUDA else [1, 2, 5, 17])
    _check_other_rows(fn, full, same_tiles=False)


def test_moe_fp8_plain_stacks_take_the_bf16_path():
    h, e, i, k = SMALL
    router, gate, up, down = _weights(h, e, i, torch.float32)
    plain = [w.dequantize(torch.float32) for w in (gate, up, down)]
    x = _rand(5, h, seed=50)
    got = tmoe.moe(x, router, *plain, k, True)
    assert torch.equal(got, dense_moe.moe(x, router, *plain, k, True))  # the same kernels
    # and the FP8 stacks give the same values up to the sums' order (per K block, then scaled)
    assert _rel_err(tmoe.moe(x, router, gate, up, down, k, True), got) < MOE_TOL[torch.float32]


def _prompt_ref(x, router, gate, up, down, k, normalize):
    """The MoE as prompt rows compute it, in float64: routed on x, each expert's gate and up
    products of x's block-FP8 activations, and its down product of the SwiGLU's (rounded to
    x's dtype first, as the kernel stores it), each quantized as act_quant does."""
    weights, ids = moe_ref.route(x, router, k, normalize)
    g, u, d = (w.dequantize(torch.float64) for w in (gate, up, down))
    xq = _act_ref(x.cpu()).to(x.device)
    slots = torch.zeros(x.shape[0], k, x.shape[1], dtype=torch.float64, device=x.device)
    for r in range(x.shape[0]):
        for j in range(k):
            e = int(ids[r, j])
            h = torch.nn.functional.silu(xq[r] @ g[e].T) * (xq[r] @ u[e].T)
            hq = _act_ref(h[None].to(x.dtype).cpu())[0].to(x.device)
            slots[r, j] = hq @ d[e].T
    return moe_ref.add_slots(slots.to(x.dtype), weights, None)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_moe_fp8_prompt_rows_near_reference_and_row_invariant(case):
    """Prompt rows (kernels/row_kind.py) in tiles of PROMPT_BLOCK_M pairs, one row too, their
    activations in block FP8 (both products): near the reference of that arithmetic, laid
    out in those tiles, and a row's bits its own among any rows."""
    (h, e, i, k), dtype = case
    router, gate, up, down = _weights(h, e, i, dtype)
    full = _rand(24, h, dtype=dtype, seed=51)
    fn = lambda x: tmoe.moe(x, router, gate, up, down, k, True)  # noqa: E731
    with row_kind.uniform(True):
        for m in (1, 3, 24):
            want = _prompt_ref(full[:m], router, gate, up, down, k, True)
            assert _rel_err(fn(full[:m]), want) < PROMPT_TOL[dtype]
        logits = torch.nn.functional.linear(full[:3], router).float()
        *_, layout = tmoe._route(full[:3], logits, k, True, 0, gate)
        assert layout[2] == tmoe.PROMPT_BLOCK_M
        _check_rows(fn, full, m_sweep=[1, 2, 5, 17])
        _check_other_rows(fn, full, same_tiles=False)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_moe_fp8_mixed_forward_routes_each_kind_apart(case):
    """A forward of decode rows then prompt rows: each kind's rows routed and run apart, with
    the bits they get alone (moe with its shared add, and moe_shared)."""
    (h, e, i, k), dtype = case
    router, gate, up, down = _weights(h, e, i, dtype)
    x = _rand(20, h, dtype=dtype, seed=52)
    logits, s = _rand(20, 1, dtype=dtype, seed=53), _rand(20, h, dtype=dtype, seed=54)
    r1 = torch.cat([router, _rand(1, h, dtype=dtype, scale=h**-0.5, seed=55)])
    g1, u1 = (cat_stack(w, _fp8(i, h, seed=sd).to(DEVICE)) for w, sd in ((gate, 56), (up, 57)))
    d1 = cat_stack(down, _fp8(h, i, seed=58).to(DEVICE))
    with row_kind.rows(6, 20):
        mixed = tmoe.moe(x, router, gate, up, down, k, True, (logits, s))
        both = tmoe.moe_shared(x, r1, g1, u1, d1, k, True)
    for a, b, prompt in ((0, 6, False), (6, 20, True)):
        with row_kind.uniform(prompt):
            part = (logits[a:b], s[a:b])
            assert torch.equal(mixed[a:b], tmoe.moe(x[a:b], router, gate, up, down, k, True, part))
            assert torch.equal(both[a:b], tmoe.moe_shared(x[a:b], r1, g1, u1, d1, k, True))


@pytest.mark.parametrize("case", CASES, ids=str)
def test_moe_fp8_act_quantized_in_the_gate_up_store_keeps_the_bits(case, monkeypatch, exact_e4m3):
    """Prompt rows' act quantized in the gate/up tile's store (QUANT_IN_TILE; a partial last
    group of columns at SMALL) gives act_quant's codes and scales after it: the same
    outputs, bit for bit, through moe and moe_shared (on the CPU under exact_e4m3, against
    act_quant_ref)."""
    (h, e, i, k), dtype = case
    router, gate, up, down = _weights(h, e, i, dtype)
    x = _rand(40, h, dtype=dtype, seed=59)
    r1 = torch.cat([router, _rand(1, h, dtype=dtype, scale=h**-0.5, seed=60)])
    g1, u1 = (cat_stack(w, _fp8(i, h, seed=sd).to(DEVICE)) for w, sd in ((gate, 61), (up, 62)))
    d1 = cat_stack(down, _fp8(h, i, seed=63).to(DEVICE))

    def both():
        return tmoe.moe(x, router, gate, up, down, k, True), tmoe.moe_shared(
            x, r1, g1, u1, d1, k, True
        )

    with row_kind.uniform(True):
        monkeypatch.setattr(tmoe, "QUANT_IN_TILE", True)
        fused = both()
        monkeypatch.setattr(tmoe, "QUANT_IN_TILE", False)
        after = both()
    assert all(torch.equal(a, b) for a, b in zip(fused, after, strict=True))
