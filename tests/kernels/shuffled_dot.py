"""A tl.dot for Triton's interpreter whose bits depend on the tile, as some BLAS's do.

Under `TRITON_INTERPRET=1` tl.dot is numpy's matmul, so the bits of an element depend on the
BLAS kernel numpy picks for the host's CPU (OpenBLAS has one per CPU family) and, within it,
on the tile's shape and the element's place in the tile. A test that claims equal bits
through a dot passes on one machine and fails on another. With `FLASHLANE_SHUFFLED_DOT=1`
(tests/kernels/conftest.py) the interpreter's dot sums each element in one of three orders,
chosen by the tile's shape and the element's place; every other result (the same tile at the
same place) stays the same bits. A bit-equality claim that survives it does not depend on
the BLAS.

    FLASHLANE_SHUFFLED_DOT=1 TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels
"""

from __future__ import annotations

import numpy as np


def shuffled_matmul(a: np.ndarray, b: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    """a [M, K] @ b [K, N] in out_dtype; each element in an order set by (M, N, K, i, j)."""
    a32, b32 = a.astype(out_dtype), b.astype(out_dtype)
    m, k = a32.shape[-2:]
    n = b32.shape[-1]
    half = k // 2
    orders = np.stack(
        [
            np.matmul(a32, b32),
            np.matmul(a32.astype(np.float64), b32.astype(np.float64)).astype(out_dtype),
            np.matmul(a32[..., half:], b32[half:]) + np.matmul(a32[..., :half], b32[:half]),
        ]
    )
    # a hash, not a linear form: a shift of rows or columns by any stride changes the order
    i = np.arange(1, m + 1, dtype=np.uint64).reshape(m, 1)
    j = np.arange(7, n + 7, dtype=np.uint64).reshape(1, n)
    shape = np.array([m * 131 + n * 137 + k * 139], dtype=np.uint64)
    with np.errstate(over="ignore"):
        h = i * np.uint64(0x9E3779B97F4A7C15) ^ j * np.uint64(0xBF58476D1CE4E5B9)
        h ^= shape * np.uint64(0x94D049BB133111EB)
    which = ((h >> np.uint64(33)) % np.uint64(3)).astype(np.int64)
    return np.take_along_axis(orders, np.broadcast_to(which, orders.shape[1:])[None], 0)[0]


def install() -> None:
    """Replace the interpreter's dot (triton 3.6 `InterpreterBuilder.create_dot`)."""
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.dtype.primitive_bitwidth == 8 or not d.dtype.scalar.is_fp32():
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        out = shuffled_matmul(a.data, b.data, d.data.dtype) + d.data
        return interpreter.TensorHandle(out, d.dtype.scalar)

    builder.create_dot = create_dot
