"""Where the Triton kernel tests run: on a CUDA GPU (bf16 and fp32), or on the CPU through
Triton's interpreter (`TRITON_INTERPRET=1`, fp32 only: the interpreter has no bf16). Without
either they skip.

    TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels     # CPU, small shapes
    python -m pytest -m "triton or cuda" tests/kernels               # GPU
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
HAS_TRITON = importlib.util.find_spec("triton") is not None
RUNS = HAS_TRITON and (HAS_CUDA or INTERPRET)
DEVICE = "cuda" if HAS_CUDA else "cpu"
# the interpreter computes bf16 wrongly; it checks the kernels' indexing and arithmetic in fp32
DTYPES = [torch.float32, torch.bfloat16] if HAS_CUDA else [torch.float32]

needs_triton = [
    pytest.mark.triton,
    pytest.mark.cuda,
    pytest.mark.skipif(not RUNS, reason="needs Triton with a GPU or TRITON_INTERPRET=1"),
]

# Under the interpreter tl.dot is numpy's matmul, and an element's bits depend on the BLAS
# kernel numpy picks for the host's CPU and on the element's place in the tile (OpenBLAS's
# Haswell kernel gave 37 failures where its SkylakeX kernel gave none; shuffled_dot.py makes
# the dependence deliberate). So a claim that results through dots in different calls, tiles
# or places have equal bits (row invariance, a fused kernel giving a plain one's bits) is a
# GPU claim: bitwise there, and under the interpreter within DOT_TOL of the largest value
# (fp32 sums in other orders: 1.5e-7..4.3e-7 measured on linear and attention rows under the
# Haswell kernel and shuffled_dot), which still catches a wrong row, column or mask (errors
# of the values' own size).
DOT_TOL = 1e-5


def dot_mismatch(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """Why got is not want, or None: bitwise on the GPU; under the interpreter the same shape,
    dtype, NaNs and infinities, and every finite element within DOT_TOL of want's largest
    finite magnitude."""
    if not INTERPRET:
        return None if torch.equal(got, want) else "bits differ"
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.shape} {got.dtype} against {want.shape} {want.dtype}"
    special = ~torch.isfinite(want)
    if not torch.equal(got[special].nan_to_num(), want[special].nan_to_num()):
        return "NaN or infinities differ"
    g, w = got[~special].double(), want[~special].double()
    if not torch.isfinite(g).all():
        return "NaN or infinities differ"
    if w.numel():
        err, top = (g - w).abs().max().item(), w.abs().max().item()
        if err > DOT_TOL * top:
            return f"max error {err:.3g}, {err / max(top, 1e-300):.3g} of the largest"
    return None


def assert_dot_equal(got: torch.Tensor, want: torch.Tensor, msg: object = None) -> None:
    """got == want bitwise on the GPU, within DOT_TOL under the interpreter (dot_mismatch)."""
    why = dot_mismatch(got, want)
    assert why is None, f"{msg}: {why}"


def exact_in_interpreter(t: torch.Tensor, step: float = 2**-6) -> torch.Tensor:
    """Under the interpreter, t rounded to multiples of `step` (a power of two): products of
    two such values are multiples of step^2, and their sums are exact in fp32 in any order
    while they stay under 2^24 step^2 (4096 for the default), so equal inputs give equal bits
    through any BLAS (ties stay ties). On the GPU t itself: there the kernels' own order makes
    equal inputs equal bits, as the tests check."""
    return (t / step).round() * step if INTERPRET else t
