"""Triton norms (RMSNorm, its groups, the gated norm, l2norm) against the pure-torch
references, row invariance, and rows read where they lie. Tolerances: test_triton_dense.py's
docstring (fp32 1e-5; bf16 2e-2, one or two bf16 steps).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_norms.py`.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DTYPES, HAS_CUDA, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.norms import reference as norms_ref  # noqa: E402
from flashlane.kernels.norms import triton as tnorm  # noqa: E402
from flashlane.kernels.norms.reference import l2norm as l2norm_ref  # noqa: E402
from tests.kernels.test_triton_dense import (  # noqa: E402
    _check_other_rows,
    _check_rows,
    _rand,
    _rel_err,
)

NORM_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
NORM_WIDTHS = [96, 128, 2560] if HAS_CUDA else [96, 100]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", NORM_WIDTHS)
@pytest.mark.parametrize("m", [1, 3, 17, 65])
def test_norms_match_reference(m, d, dtype):
    x = _rand(m, d, dtype=dtype, seed=10)
    gate = _rand(m, d, dtype=dtype, seed=11)
    w = _rand(d, dtype=dtype, scale=0.1, seed=12)
    eps = 1e-6
    tol = NORM_TOL[dtype]
    out = tnorm.rms_norm(x, w, eps)
    assert out.dtype == dtype
    assert _rel_err(out, norms_ref.rms_norm(x, w, eps)) < tol
    grp = d // 4 if d % 4 == 0 else d
    assert _rel_err(tnorm.rms_norm(x, w, eps, grp), norms_ref.rms_norm(x, w, eps, grp)) < tol
    for act in ("silu", "sigmoid"):
        out = tnorm.gated_rms_norm(x, gate, 1.0 + w, eps, act)
        assert _rel_err(out, norms_ref.gated_rms_norm(x, gate, 1.0 + w, eps, act)) < tol
    # fp32 weight on a lower-precision x: the reference's product stays fp32
    w32 = (1.0 + w).float()
    out = tnorm.gated_rms_norm(x, gate, w32, eps, "silu")
    assert _rel_err(out, norms_ref.gated_rms_norm(x, gate, w32, eps, "silu")) < tol
    out = tnorm.l2norm(x.float()).to(dtype)
    assert _rel_err(tnorm.l2norm(x), l2norm_ref(x.float())) < tol
    assert _rel_err(out, l2norm_ref(x.float())) < tol


@pytest.mark.parametrize("n", [1, 3])
def test_gated_norm_reads_a_strided_gate_where_it_lies(n):
    """The GDN's output gate is a column slice of its input projection ([N, HV, Dv] in rows
    of a wider tensor): the norm reads it in place, bitwise as from a contiguous copy, and
    so a 2-D gate of strided rows."""
    hv, dv = 6, 32
    x = _rand(n, hv, dv, seed=21)
    wide = _rand(n, hv * dv + 40, seed=22)
    gate = wide[:, 8 : 8 + hv * dv].reshape(n, hv, dv)
    w = _rand(dv, scale=0.1, seed=23)
    want = tnorm.gated_rms_norm(x, gate.contiguous(), w, 1e-6, "sigmoid")
    assert torch.equal(tnorm.gated_rms_norm(x, gate, w, 1e-6, "sigmoid"), want)
    flat_x, flat_g = x.reshape(n * hv, dv), wide[:, 8 : 8 + dv]
    want2 = tnorm.gated_rms_norm(flat_x[:n], flat_g.contiguous(), w, 1e-6, "silu")
    assert torch.equal(tnorm.gated_rms_norm(flat_x[:n], flat_g, w, 1e-6, "silu"), want2)


@pytest.mark.parametrize("n", [1, 3])
def test_rms_norm_reads_evenly_spaced_rows_where_they_lie(n):
    """The attention's queries are a column slice of the projection (each head's first half
    of 2 * D values): the norm reads them in place (no copy launch), bitwise as from a
    contiguous copy, with or without groups; rows not evenly spaced are copied first."""
    heads, d = 3, 64
    qg = _rand(n, heads, 2 * d, seed=24)
    q = qg[..., :d]
    w = _rand(d, scale=0.1, seed=25)
    for group in (None, d // 2):
        got = tnorm.rms_norm(q, w, 1e-6, group)
        assert got.is_contiguous() and got.shape == q.shape
        assert torch.equal(got, tnorm.rms_norm(q.contiguous(), w, 1e-6, group))
    uneven = _rand(n, 2, 5, d, seed=26)[:, :, 1:4]  # rows 0-2 then 5-7 of each head pair
    assert torch.equal(
        tnorm.rms_norm(uneven, w, 1e-6), tnorm.rms_norm(uneven.contiguous(), w, 1e-6)
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_of_gathered_rows_is_the_norm_of_those_rows(dtype):
    """rows: the norm of x[rows] (a drafted step's last kept rows, read where they lie),
    bitwise the norm of the gathered copy, with or without groups, a row picked twice too;
    the reference likewise."""
    x = _rand(7, 96, seed=27).to(dtype)
    w = _rand(96, scale=0.1, seed=28).to(dtype)
    rows = torch.tensor([5, 0, 5], device=x.device)
    for group in (None, 32):
        got = tnorm.rms_norm(x, w, 1e-6, group, rows=rows)
        assert got.shape == (3, 96)
        assert torch.equal(got, tnorm.rms_norm(x[rows], w, 1e-6, group))
        want = norms_ref.rms_norm(x, w, 1e-6, group, rows=rows)
        assert torch.equal(want, norms_ref.rms_norm(x[rows], w, 1e-6, group))
    with pytest.raises(ValueError, match="rows index"):
        tnorm.rms_norm(x[None], w, 1e-6, rows=rows)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_keeps_each_runs_picked_row_in_the_same_launch(dtype):
    """keep: out[b] = x[picks[b]] (each pick in its own run of N / B rows: a drafted step's
    last kept rows) while the norm is the plain one, bitwise; the reference likewise; a
    session's kept row depends on its own pick alone."""
    x = _rand(9, 96, seed=29).to(dtype)
    w = _rand(96, scale=0.1, seed=30).to(dtype)
    picks = torch.tensor([2, 3, 7], device=x.device)
    for group in (None, 32):
        for norm in (tnorm.rms_norm, norms_ref.rms_norm):
            out = torch.zeros(3, 96, dtype=dtype, device=x.device)
            got = norm(x, w, 1e-6, group, keep=(picks, out))
            assert torch.equal(got, norm(x, w, 1e-6, group))
            assert torch.equal(out, x[picks])
    out = torch.zeros(3, 96, dtype=dtype, device=x.device)
    tnorm.rms_norm(x, w, 1e-6, keep=(torch.tensor([0, 5, 8], device=x.device), out))
    assert torch.equal(out[0], x[0]) and torch.equal(out[1:], x[[5, 8]])
    with pytest.raises(ValueError, match="keep needs"):
        tnorm.rms_norm(x, w, 1e-6, keep=(picks[:2], out[:2]))
    with pytest.raises(ValueError, match="keep needs"):
        tnorm.rms_norm(x, w, 1e-6, rows=picks, keep=(picks, out))


def test_norms_leading_dims():
    x = _rand(2, 3, 4, 64, seed=13)
    g = _rand(2, 3, 4, 64, seed=14)
    w = _rand(64, scale=0.1, seed=15)
    torch.testing.assert_close(tnorm.rms_norm(x, w, 1e-6), norms_ref.rms_norm(x, w, 1e-6))
    torch.testing.assert_close(
        tnorm.gated_rms_norm(x, g, w, 1e-6, "sigmoid"),
        norms_ref.gated_rms_norm(x, g, w, 1e-6, "sigmoid"),
    )
    torch.testing.assert_close(tnorm.l2norm(x), l2norm_ref(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms_row_invariant(dtype):
    d = 2560 if HAS_CUDA else 96
    full = _rand(100, d, dtype=dtype, seed=16)
    gate = _rand(100, d, dtype=dtype, seed=17)
    w = _rand(d, dtype=dtype, scale=0.1, seed=18)
    for fn in (
        lambda x: tnorm.rms_norm(x, w, 1e-6),
        lambda x: tnorm.rms_norm(x, w, 1e-6, d // 2),
        lambda x: tnorm.l2norm(x),
    ):
        _check_rows(fn, full)
        _check_other_rows(fn, full)
    # the gated norm takes the gate rows alongside; rows of 128 (the GDN's heads) go several
    # to a program
    both = torch.cat([full, gate], dim=-1)
    fn = lambda xg: tnorm.gated_rms_norm(xg[:, :d], xg[:, d:], w, 1e-6, "silu")  # noqa: E731
    _check_rows(fn, both)
    _check_other_rows(fn, both)
    hd = min(128, d // 2)
    heads = torch.cat([full[:, :hd], gate[:, :hd]], dim=-1)

    def fn(xg):
        return tnorm.gated_rms_norm(xg[:, :hd], xg[:, hd:], w[:hd], 1e-6, "sigmoid")

    _check_rows(fn, heads)
    _check_other_rows(fn, heads)
