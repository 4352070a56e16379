"""Prompt tiles' operands through TMA descriptors (kernels/tma.py): the dense linear's x and
w loaded by TMA give the bits of its pointer loads, in every prompt path (all partitions in
one loop, FLAT; the loop over partitions; a column slice of x), and the calls TMA cannot
take (decode rows, split partitions, fp32 products, rows not 16-byte multiples) keep the
pointer loads. The experts' weights: test_triton_moe.py.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_tma.py`.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_triton_dense import _rand
from tests.kernels.triton_env import (
    DEVICE,
    HAS_CUDA,
    assert_dot_equal,
    exact_in_interpreter,
    needs_triton,
)

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels import tma  # noqa: E402
from flashlane.kernels.linear import triton as tlin  # noqa: E402

DTYPES = [torch.bfloat16, torch.float16]
# (N, K): FLAT (many partitions), the partition loop (128 x 128 tiles, N >= 1024), the
# decode tile kept for a narrow prompt product; the real sizes on a GPU
SHAPES = [(33, 1536), (1040, 320), (40, 200)] + (
    [(324, 10240), (16480, 2560), (2560, 6144)] if HAS_CUDA else []
)


def _spied(monkeypatch) -> list[bool]:
    """The TMA flags linear's launches took, in order."""
    taken: list[bool] = []
    plain = tma.linear_operands

    def spy(*args):
        out = plain(*args)
        taken.append(out[2])
        return out

    monkeypatch.setattr(tma, "linear_operands", spy)
    return taken


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nk", SHAPES, ids=str)
def test_linear_prompt_rows_through_tma_keep_the_bits(nk, dtype, monkeypatch):
    n, k = nk
    m = 200 if HAS_CUDA else 70
    x, w = _rand(m, k + 8, seed=61), _rand(n, k, seed=62)
    if HAS_CUDA:  # exponents spread over 2^-8..2^8; the interpreter: sums exact in any order
        g = torch.Generator(device=DEVICE).manual_seed(63)
        x = x * torch.exp2(torch.randint(-8, 9, x.shape, device=DEVICE, generator=g))
    x, w = exact_in_interpreter(x).to(dtype), exact_in_interpreter(w).to(dtype)
    monkeypatch.setattr(tlin, "_IN_PROGRAM_TILES", 1)  # every partition in one program
    taken = _spied(monkeypatch)
    for xs in (x[:, :k].contiguous(), x[:, 8:]):  # whole rows, and a column slice
        monkeypatch.setattr(tma, "PROMPT", False)
        want = tlin.linear(xs, w)
        monkeypatch.setattr(tma, "PROMPT", True)
        got = tlin.linear(xs, w)
        assert taken[-2:] == [False, True]  # TMA read this call's operands
        assert_dot_equal(got, want)
        # a row alone (decode tiles, pointer loads) and among the prompt rows agree
        assert_dot_equal(tlin.linear(xs[5:6], w), got[5:6])
        assert taken[-1] is False


def test_tma_only_where_it_can(monkeypatch):
    monkeypatch.setattr(tma, "PROMPT", True)
    w = _rand(64, 40, dtype=torch.bfloat16)
    x = _rand(100, 40, dtype=torch.bfloat16)
    cfg = tlin.prefill_tile(64, 40, torch.bfloat16)
    assert tma.linear_operands(x, w, cfg, True)[2] is True
    assert tma.linear_operands(x, w, cfg, False)[2] is False  # not a prompt tile
    odd = _rand(100, 44, dtype=torch.bfloat16)[:, :36]  # rows of 88 bytes
    assert tma.linear_operands(odd, w[:, :36].contiguous(), cfg, True)[2] is False
    monkeypatch.setattr(tma, "PROMPT", False)
    assert tma.linear_operands(x, w, cfg, True)[2] is False
