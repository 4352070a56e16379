"""Decode rows' block-FP8 products in f16 (kernels/linear/triton_fp8.py F16, fp8_convert's
`f16_dot`): each row's K block scaled into f16 by a power of two, the e4m3 weights unpacked
to f16, the dot's sum scaled back. Near the reference (dequantized weights, float64) for
the linear and the experts, on rows whose values span many binades, rows of zeros included;
row-invariant like the bf16 products (a row alone gives its bits in any batch).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_fp8_f16.py`.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_triton_dense import _check_rows
from tests.kernels.test_triton_fp8 import _rel_err, _w, _x
from tests.kernels.triton_env import DEVICE, HAS_CUDA, assert_dot_equal, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.linear import triton_fp8 as tfp8  # noqa: E402
from flashlane.kernels.moe import triton_fp8 as tmoe  # noqa: E402
from tests.kernels.test_triton_moe_fp8 import _weights  # noqa: E402

NK = [(70, 130), (33, 300), (130, 1100)] + ([(2560, 6144), (16480, 2560)] if HAS_CUDA else [])
# fp16 x only checks the mode; its outputs overflow at these magnitudes
DTYPES = [torch.bfloat16]
TOL = 8e-3  # one 16-bit rounding of the output, fp32 sums, f16's subnormals under 2^-24


@pytest.fixture
def f16(monkeypatch):
    monkeypatch.setattr(tfp8, "F16", True)


def _spread(m, k, dtype, seed):
    """Rows over 2^-12..2^12 a value, row 1 all zeros, row 2 one value far above the rest
    (2^20; fp16 holds 2^15)."""
    x = _x(m, k, torch.float32, seed)
    g = torch.Generator(device=DEVICE).manual_seed(seed + 1)
    x = x * torch.exp2(torch.randint(-12, 13, x.shape, device=DEVICE, generator=g).float())
    if m > 2:
        x[1] = 0.0
        x[2, 7] = 2.0**20 if dtype == torch.bfloat16 else 2.0**15
    return x.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nk", NK, ids=str)
def test_f16_products_near_the_reference(nk, dtype, f16):
    n, k = nk
    assert tfp8.by_bits(_x(1, k, dtype, 0)) == 2 == tfp8.by_bits(_x(1, k, torch.float16, 0))
    w = _w(n, k, 2, spread=True)
    for m in (1, 3, 17):
        x = _spread(m, k, dtype, 1)
        y = tfp8.linear(x, w)
        ref = x.double() @ w.dequantize(torch.float64).T
        assert y.dtype == dtype and not y.isnan().any()
        for r in range(m):  # each row against its own largest value
            assert _rel_err(y[r], ref[r]) < TOL if ref[r].abs().max() > 0 else not y[r].any()


@pytest.mark.parametrize("nk", NK, ids=str)
def test_f16_products_row_invariant(nk, f16):
    n, k = nk
    full = _spread(64, k, torch.bfloat16, 5)
    w = _w(n, k, 6, spread=True)
    _check_rows(lambda x: tfp8.linear(x, w), full, m_sweep=[1, 2, 5, 17, 64], offsets=[0, 3])


def test_f16_experts_near_the_fp32_products(f16):
    """The grouped experts' decode tiles (gate / up and down) in f16 products, against the
    same experts in fp32 products (exact: IEEE) for the same routes."""
    h, e, i, k = (160, 6, 136, 3)
    _, gate, up, down = _weights(h, e, i, torch.bfloat16)
    x = _spread(9, h, torch.bfloat16, 8) * 2.0**-6  # the silu's inputs near 1
    g = torch.Generator(device=DEVICE).manual_seed(9)
    ids = torch.stack([torch.randperm(e, generator=g, device=DEVICE)[:k] for _ in range(9)])
    w = torch.softmax(torch.randn(9, k, generator=g, device=DEVICE), -1)
    out = tmoe.experts_fp8(x, w.to(x.dtype), ids, gate, up, down)
    want = tmoe.experts_fp8(x.float(), w, ids, gate, up, down)
    assert not out.isnan().any() and not out[1].any()  # a row of zeros gives zeros
    keep = [r for r in range(9) if r != 2]  # row 2's one huge value rules its own scale
    assert _rel_err(out[keep], want[keep]) < 3e-2
    for o, m in ((0, 1), (3, 5), (8, 1)):
        alone = tmoe.experts_fp8(x[o : o + m], w[o : o + m].to(x.dtype), ids[o : o + m], gate,
                                 up, down)  # fmt: skip
        assert_dot_equal(alone, out[o : o + m])
