"""The PLE's two launches (`kernels/rowwise/triton_ple.py`) against the torch references:
the n-gram embeddings bit for bit (a gather), the gate within the dtype's rounding (its sum
runs in another order than torch's), each row its own.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_ple.py`.
"""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.rowwise import reference as ref
from tests.kernels.test_triton_rowwise import _close, _rand, _rows_invariant
from tests.kernels.triton_env import DEVICE, DTYPES, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.rowwise import triton_ple as trp  # noqa: E402


@pytest.mark.parametrize("d", [16, 20])  # a power of two, and one the program pads
def test_ngram_embed_bit_for_bit(d):
    n, heads, eos = 3, 5, 1
    g = torch.Generator(device=DEVICE).manual_seed(40)
    history = torch.randint(0, 6, (3, n - 1 + 7), generator=g, device=DEVICE)  # many eos
    history[0, :2] = eos
    mult = torch.tensor([2**61 + 3, 2**62 - 57, 2**60 + 11], device=DEVICE)  # wrapping
    sizes = torch.tensor([7, 11, 13, 17, 19, 23, 29, 31, 37, 41], device=DEVICE)
    offsets = torch.cumsum(sizes, 0) - sizes
    table = _rand(int(sizes.sum()), d, dtype=torch.bfloat16, seed=41)
    args = (mult, sizes, offsets, n, heads, eos, table)
    got = trp.ngram_embed(history, *args)
    assert got.shape == (3, 7, (n - 1) * heads * d)
    assert torch.equal(got, ref.ngram_embed(history, *args))
    assert torch.equal(trp.ngram_embed(history[1:], *args), got[1:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [16, 20])
def test_ngram_embed_int8_table_bit_for_bit(d, dtype):
    """An 8-bit table (models/table8.py): the kernel scales each loaded row as the reference
    does (q.float() * scale, rounded to dtype once): the same bits, each row its own."""
    from flashlane.models.table8 import quantize_rows

    n, heads, eos = 4, 3, 1
    g = torch.Generator(device=DEVICE).manual_seed(46)
    history = torch.randint(0, 9, (4, n - 1 + 6), generator=g, device=DEVICE)
    mult = torch.tensor([2**61 + 3, 2**62 - 57, 2**60 + 11, 2**59 + 7], device=DEVICE)
    sizes = torch.tensor([7, 11, 13, 17, 19, 23, 29, 31, 37], device=DEVICE)
    offsets = torch.cumsum(sizes, 0) - sizes
    table = _rand(int(sizes.sum()), d, dtype=torch.float32, seed=47)
    table[3] = 0  # a zero row: scale 1, zeros
    q, scale = quantize_rows(table)
    args = (mult, sizes, offsets, n, heads, eos, q)
    got = trp.ngram_embed(history, *args, scale, dtype)
    want = ref.ngram_embed(history, *args, scale, dtype)
    assert got.dtype == dtype and got.shape == (4, 6, (n - 1) * heads * d)
    assert torch.equal(got, want)
    assert not torch.equal(want, ref.ngram_embed(history, *args[:-1], table.to(dtype)))
    assert torch.equal(trp.ngram_embed(history[2:], *args, scale, dtype), got[2:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h", [64, 48])
def test_ple_gate(dtype, h):
    m, hc = 9, 4
    key, r = _rand(m, hc * h, dtype=dtype, seed=42), _rand(m, hc * h, dtype=dtype, seed=43)
    value = _rand(m, h, dtype=dtype, seed=44)
    norms = [_rand(hc * h, dtype=dtype, seed=45 + i, scale=0.1) for i in range(3)]
    key[2] = 0  # a zero gate: its sign is 0, its size clamped
    got = trp.ple_gate(key, r, value, *norms, 1e-6)
    want = ref.ple_gate(key, r, value, *norms, 1e-6)
    for a, b in zip(got, want):
        _close(a, b, dtype)
    # the conv's norm is the norms kernel's on the gated rows
    from flashlane.kernels.norms import triton as trn

    assert torch.equal(got[1], trn.rms_norm(got[0], norms[2], 1e-6, h))
    _rows_invariant(lambda k, x, v: trp.ple_gate(k, x, v, *norms, 1e-6), key, r, value)
