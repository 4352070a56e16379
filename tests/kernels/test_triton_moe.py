"""The Triton MoE (grouped experts, combine, the shared expert's add): against the pure-torch
reference, and row invariance. Tolerances and helpers are test_triton_dense.py's (bf16 MoE:
3e-2, as intermediate roundings may flip to the neighbouring bf16 value and pass through
gate/up, silu, down and k slots). Claims of equal bits across calls whose rows share tiles
differently are bitwise on the GPU and within DOT_TOL under the interpreter (triton_env's
assert_dot_equal); ties are planted in values whose dots are exact on any BLAS
(exact_in_interpreter).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_moe.py`.
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.kernels.test_triton_dense import (
    TOL,
    _check_other_rows,
    _check_rows,
    _rand,
    _rel_err,
)
from tests.kernels.triton_env import (
    DEVICE,
    DTYPES,
    HAS_CUDA,
    assert_dot_equal,
    exact_in_interpreter,
    needs_triton,
)

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.moe import reference as moe_ref  # noqa: E402
from flashlane.kernels.moe import triton as tmoe  # noqa: E402

MOE_TOL = {torch.float32: 1e-5, torch.bfloat16: 3e-2}
# (H, E, I, top_k)
SMALL_MOE = (80, 8, 40, 3)
REAL_MOE = (2560, 512, 640, 10)


@functools.cache
def _moe_weights(h, e, i, dtype, seed=20):
    router = _rand(e, h, scale=h**-0.5, seed=seed)
    gate = _rand(e, i, h, dtype=dtype, scale=h**-0.5, seed=seed + 1)
    up = _rand(e, i, h, dtype=dtype, scale=h**-0.5, seed=seed + 2)
    down = _rand(e, h, i, dtype=dtype, scale=i**-0.5, seed=seed + 3)
    return router.to(dtype), gate, up, down


MOE_CASES = [(SMALL_MOE, dt) for dt in DTYPES] + ([(REAL_MOE, torch.bfloat16)] if HAS_CUDA else [])


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("case", MOE_CASES, ids=str)
@pytest.mark.parametrize("m", [1, 3, 17, 64, 65])
def test_moe_matches_reference(m, case, normalize):
    (h, e, i, k), dtype = case
    router, gate, up, down = _moe_weights(h, e, i, dtype)
    x = _rand(m, h, dtype=dtype, seed=21)
    w_t, ids_t = tmoe.route(x, router, k, normalize)
    w_r, ids_r = moe_ref.route(x, router, k, normalize)
    assert torch.equal(ids_t, ids_r)
    assert w_t.dtype == dtype and _rel_err(w_t, w_r) < TOL[dtype]
    out = tmoe.moe(x, router, gate, up, down, k, normalize)
    assert out.dtype == dtype and out.shape == x.shape
    assert _rel_err(out, moe_ref.moe(x, router, gate, up, down, k, normalize)) < MOE_TOL[dtype]


@pytest.mark.parametrize("normalize", [False, True])
def test_moe_ties_go_to_the_lower_expert(normalize):
    h, e, i, k = SMALL_MOE
    router, gate, up, down = _moe_weights(h, e, i, torch.float32)
    router = exact_in_interpreter(router.clone())  # the weights are cached: change a copy
    router[5] = router[2]  # experts 2 and 5 always tie
    router[6] = router[1]  # and 1 and 6
    x = exact_in_interpreter(_rand(40, h, seed=22))
    w, ids = tmoe.route(x, router, k, normalize)
    _, ref_ids = moe_ref.route(x, router, k, normalize)
    assert torch.equal(ids, ref_ids)
    for lo, hi in ((2, 5), (1, 6)):
        has_lo, has_hi = (ids == lo).any(-1), (ids == hi).any(-1)
        assert not (has_hi & ~has_lo).any(), "the higher id was taken without the lower"
        both = has_lo & has_hi
        pos_lo = (ids == lo).int().argmax(-1)
        pos_hi = (ids == hi).int().argmax(-1)
        assert (pos_lo[both] < pos_hi[both]).all()
        assert torch.equal(w[both, pos_lo[both]], w[both, pos_hi[both]])
    if normalize:
        torch.testing.assert_close(w.sum(-1), torch.ones_like(w[:, 0]))
    out = tmoe.moe(x, router, gate, up, down, k, normalize)
    assert _rel_err(out, moe_ref.moe(x, router, gate, up, down, k, normalize)) < 1e-5


@pytest.mark.parametrize("case", MOE_CASES, ids=str)
def test_moe_with_the_shared_expert_added_in_the_combine(case):
    """moe(..., shared=(gate logit, s)) adds sigmoid(logit) * s in the combine launch: the
    reference's gated add, within the MoE tolerance, and the bits of the routed output plus
    the same rounded ops; row-invariant."""
    (h, e, i, k), dtype = case
    router, gate, up, down = _moe_weights(h, e, i, dtype)
    x = _rand(33, h, dtype=dtype, seed=24)
    logits = _rand(33, 3, dtype=dtype, seed=25)[:, 1:2]  # a strided column, as stacked
    s = _rand(33, h, dtype=dtype, seed=26)
    got = tmoe.moe(x, router, gate, up, down, k, True, (logits, s))
    want = moe_ref.moe(x, router, gate, up, down, k, True, (logits, s))
    assert got.dtype == dtype and _rel_err(got, want) < MOE_TOL[dtype]
    routed = tmoe.moe(x, router, gate, up, down, k, True)
    assert not torch.equal(got, routed)  # the shared part is there
    for o, m in ((0, 1), (5, 7), (20, 13)):  # rows alone give the whole call's bits
        part = (logits[o : o + m], s[o : o + m])
        alone = tmoe.moe(x[o : o + m], router, gate, up, down, k, True, part)
        assert_dot_equal(alone, got[o : o + m], (o, m))


@pytest.mark.parametrize("case", MOE_CASES, ids=str)
@pytest.mark.parametrize("m", [1, 7, 70])
def test_moe_shared_is_one_more_expert_of_the_launches(case, m):
    """moe_shared (the shared expert stacked last) is bit for bit the routed experts over E
    plus the gated add of the shared expert's grouped output (top 1 of expert E with weight
    1) and its logit (the router product's last column in x's dtype); near the reference;
    row-invariant."""
    (h, e, i, k), dtype = case
    router, gate, up, down = _moe_weights(h, e, i, dtype)
    sr = _rand(1, h, dtype=dtype, scale=h**-0.5, seed=30)
    sg, su = (_rand(1, i, h, dtype=dtype, scale=h**-0.5, seed=s) for s in (31, 32))
    sd = _rand(1, h, i, dtype=dtype, scale=i**-0.5, seed=33)
    r1, g1, u1, d1 = (torch.cat(p) for p in ((router, sr), (gate, sg), (up, su), (down, sd)))
    x = _rand(m, h, dtype=dtype, seed=34)
    got = tmoe.moe_shared(x, r1, g1, u1, d1, k, True)
    from flashlane.kernels.linear.triton import linear

    logit = linear(x, r1, out_dtype=torch.float32)[:, e:].to(dtype)
    one = torch.ones(m, 1, dtype=dtype, device=DEVICE)
    s = tmoe.experts(x, one, torch.full((m, 1), e, device=DEVICE), g1, u1, d1)
    assert torch.equal(got, tmoe.moe(x, router, gate, up, down, k, True, (logit, s)))
    want = moe_ref.moe_shared(x, r1, g1, u1, d1, k, True)
    assert got.dtype == dtype and _rel_err(got, want) < MOE_TOL[dtype]
    if m > 1:
        _check_rows(lambda x: tmoe.moe_shared(x, r1, g1, u1, d1, k, True), x)


@pytest.mark.parametrize("case", MOE_CASES, ids=str)
def test_moe_row_invariant(case):
    (h, e, i, k), dtype = case
    router, gate, up, down = _moe_weights(h, e, i, dtype)
    full = _rand(150 if HAS_CUDA else 70, h, dtype=dtype, seed=23)
    fn = lambda x: tmoe.moe(x, router, gate, up, down, k, True)  # noqa: E731
    _check_rows(fn, full)
    _check_other_rows(fn, full, same_tiles=False)


def test_moe_pair_independent_of_tile_mates():
    """One row against many copies of rows routed to the same experts: the tile mates
    change, the row's output does not."""
    h, e, i, k = SMALL_MOE
    dtype = DTYPES[-1]
    router, gate, up, down = _moe_weights(h, e, i, dtype)
    x = _rand(1, h, dtype=dtype, seed=24)
    alone = tmoe.moe(x, router, gate, up, down, k, False)
    crowd = torch.cat([x.repeat(20, 1) * (1 + 0.01 * _rand(20, 1, dtype=dtype, seed=25)), x])
    assert_dot_equal(tmoe.moe(crowd, router, gate, up, down, k, False)[-1:], alone)
    dup = x.repeat(37, 1)
    assert_dot_equal(tmoe.moe(dup, router, gate, up, down, k, False), alone.expand(37, -1))


def test_dispatch_layout():
    ids = torch.tensor([[3, 0], [0, 3], [3, 1]], device=DEVICE)
    slot_pair, block_expert = tmoe.dispatch(ids, 4, block_m=2)
    # experts 0: pairs 1, 2; 1: pair 5; 3: pairs 0, 3, 4 -> blocks [0], [1], [3], [3]
    assert block_expert.tolist()[:4] == [0, 1, 3, 3]
    assert all(b == -1 for b in block_expert.tolist()[4:])
    assert slot_pair.tolist()[:8] == [1, 2, 5, -1, 0, 3, 4, -1]
    assert all(p == -1 for p in slot_pair.tolist()[8:])
