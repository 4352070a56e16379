"""Triton causal_conv against the torch reference, and its row invariance.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_conv.py` (fp32,
small shapes). GPU: `python -m pytest -m triton tests/kernels/test_triton_conv.py` (adds the
model's sizes: GDN C = 10240, k = 4; PLE C = 10240, k = 4, dilation 3; and bf16).

Both sides round to the output dtype after every product and sum, so without silu fp32 is
bitwise the reference. silu's exp is numpy's (interpreter) or Triton's (GPU), not torch's:
fp32 within rtol 1e-5 (a few ulps, more for large |x| where the GPU's exp2 form loses bits);
bf16 within two bf16 steps (rtol 2^-6). xfull is a copy: always bitwise.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DEVICE, HAS_CUDA, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.conv import reference as conv_ref
from flashlane.kernels.conv import triton as conv_tri

pytestmark = needs_triton

# (B, T, C, k, dilation): decode (T = 1), T below and above the window, several row and
# channel tiles (16 rows, 256 channels), k = 1 (no window), PLE's dilation 3
SHAPES = [
    (1, 1, 40, 4, 1),
    (3, 1, 70, 4, 3),
    (2, 5, 40, 4, 1),
    (2, 37, 33, 4, 1),
    (1, 3, 24, 4, 3),
    (2, 20, 24, 4, 3),
    (1, 19, 300, 2, 2),
    (2, 6, 16, 1, 1),
]
if HAS_CUDA:
    # the model's: GDN (dilation 1) and PLE (dilation 3), decode and prompt
    SHAPES += [
        (8, 1, 10240, 4, 1),
        (2, 300, 10240, 4, 1),
        (8, 1, 10240, 4, 3),
        (2, 77, 10240, 4, 3),
    ]


def _inputs(b, t, c, k, dilation, dtype=torch.float32, zero_window=False, seed=0):
    """x [B, T, C], window [B, W, C], weight: the model's [C, k] view of a [C, 1, k] tensor."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, c, generator=g)
    window = torch.randn(b, (k - 1) * dilation, c, generator=g)
    if zero_window:
        window.zero_()
    weight = torch.randn(c, 1, k, generator=g) * 0.5
    return [v.to(DEVICE, dtype) for v in (x, window, weight)]


def _check(x, window, weight, dilation, silu):
    y, xfull = conv_tri.causal_conv(x, window, weight, dilation, silu)
    y_ref, xfull_ref = conv_ref.causal_conv(x, window, weight, dilation, silu)
    assert y.shape == y_ref.shape and y.dtype == y_ref.dtype
    assert torch.equal(xfull, xfull_ref)
    if silu:
        torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=0)
    else:
        assert torch.equal(y, y_ref), (y - y_ref).abs().max().item()


@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("zero_window", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_causal_conv_matches_reference(shape, zero_window, silu):
    _, t, c, _, dilation = shape
    x, window, weight = _inputs(*shape, zero_window=zero_window, seed=t + c)
    _check(x, window, weight[:, 0, :], dilation, silu)


@pytest.mark.parametrize("silu", [False, True])
def test_causal_conv_strided_inputs(silu):
    b, t, c, k, dilation = 2, 7, 24, 4, 3
    g = torch.Generator().manual_seed(5)
    # x: a channel slice of a wider tensor; window: [B, C, W] transposed (channel stride 1
    # nowhere); weight: a [k, C] tensor transposed
    x = torch.randn(b, t, c + 9, generator=g).to(DEVICE)[:, :, 4 : 4 + c]
    window = torch.randn(b, c, (k - 1) * dilation, generator=g).to(DEVICE).transpose(1, 2)
    weight = torch.randn(k, c, generator=g).to(DEVICE).t()
    assert not (x.is_contiguous() or window.is_contiguous() or weight.is_contiguous())
    _check(x, window, weight, dilation, silu)
    # a window kept in another dtype is cast to x's, as the reference's cat does
    _check(x, window.double(), weight, dilation, silu)


@pytest.mark.parametrize("dilation", [1, 3])
def test_causal_conv_row_invariance(dilation):
    """A row's output is bitwise the same for any sub-batch, any prefix of the rows (T), and
    whatever the other sequences hold."""
    b, t, c, k = 5, 21, 40, 4
    x, window, weight = _inputs(b, t, c, k, dilation, seed=dilation)
    weight = weight[:, 0, :]
    y, xfull = conv_tri.causal_conv(x, window, weight, dilation)
    for lo, hi in [(0, 1), (1, 3), (2, 5), (4, 5)]:
        y_sub, xfull_sub = conv_tri.causal_conv(x[lo:hi], window[lo:hi], weight, dilation)
        assert torch.equal(y_sub, y[lo:hi]) and torch.equal(xfull_sub, xfull[lo:hi])
    for rows in [1, 2, 15, 16, 17]:
        y_pre, _ = conv_tri.causal_conv(x[:, :rows], window, weight, dilation)
        assert torch.equal(y_pre, y[:, :rows]), rows
    other = x.clone()
    other[1:] = torch.randn(other[1:].shape, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    assert torch.equal(conv_tri.causal_conv(other, window, weight, dilation)[0][:1], y[:1])


def test_causal_conv_empty_and_bad_shapes():
    x, window, weight = _inputs(2, 0, 16, 4, 1)
    y, xfull = conv_tri.causal_conv(x, window, weight[:, 0, :])
    assert y.shape == (2, 0, 16) and torch.equal(xfull, window)
    x, window, weight = _inputs(2, 3, 16, 4, 1)
    with pytest.raises(ValueError, match="causal_conv"):
        conv_tri.causal_conv(x, window[:, 1:], weight[:, 0, :])
    with pytest.raises(ValueError, match="causal_conv"):
        conv_tri.causal_conv(x, window, weight[:, 0, :], dilation=2)


@pytest.mark.skipif(not HAS_CUDA, reason="the interpreter has no bf16")
@pytest.mark.parametrize("weight_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("silu", [False, True])
@pytest.mark.parametrize("shape", SHAPES)
def test_causal_conv_bf16(shape, silu, weight_dtype):
    _, t, c, _, dilation = shape
    x, window, weight = _inputs(*shape, dtype=torch.bfloat16, seed=t + c)
    weight = weight.to(weight_dtype)[:, 0, :]
    y, xfull = conv_tri.causal_conv(x, window, weight, dilation, silu)
    y_ref, xfull_ref = conv_ref.causal_conv(x, window, weight, dilation, silu)
    assert y.dtype == y_ref.dtype and torch.equal(xfull, xfull_ref)
    torch.testing.assert_close(y, y_ref, rtol=2**-6, atol=1e-6)


@pytest.mark.parametrize(
    "b, t, c, k, dilation",
    [
        (1, 1, 40, 4, 1),
        (2, 1, 300, 4, 1),
        (2, 2, 40, 4, 1),
        (1, 5, 40, 4, 1),
        (2, 3, 24, 4, 3),
        (1, 16, 24, 4, 3),
    ],
)
def test_shift_moves_the_window_in_place(b, t, c, k, dilation):
    """shift=True writes xfull's last W rows into the window (rows from the old window and
    from x alike), with y and xfull as without it; the reference does the same."""
    x, window, weight = _inputs(b, t, c, k, dilation)
    w2 = weight[:, 0, :]
    y, xfull = conv_tri.causal_conv(x, window.clone(), w2, dilation)
    moved = window.clone()
    y2, xfull2 = conv_tri.causal_conv(x, moved, w2, dilation, shift=True)
    assert torch.equal(y2, y) and torch.equal(xfull2, xfull)
    assert torch.equal(moved, xfull[:, t:])
    ref_window = window.clone()
    conv_ref.causal_conv(x, ref_window, w2, dilation, shift=True)
    assert torch.equal(ref_window, moved)


def test_shift_refuses_more_rows_than_one_block():
    x, window, weight = _inputs(1, conv_tri.MAX_BLOCK_T + 1, 8, 4, 1)
    with pytest.raises(ValueError, match="shift"):
        conv_tri.causal_conv(x, window, weight[:, 0, :], shift=True)


@pytest.mark.parametrize("b, t", [(2, 1), (3, 1), (3, 4)])
def test_conv_sessions_reads_and_moves_each_window_in_place(b, t):
    """Batch b reads session b's window where it lies (separate buffers, through the
    table) and moves it past its rows: y and xfull bitwise those of causal_conv over the
    stacked windows, each window then xfull's last rows; the reference agrees."""
    c, k = 300, 4
    x, window, weight = _inputs(b, t, c, k, 1)
    w2 = weight[:, 0, :]
    windows = [window[i].clone() for i in range(b)]  # each its own buffer
    y_want, xfull_want = conv_tri.causal_conv(x, window.clone(), w2)
    y, xfull = conv_tri.conv_sessions(x, windows, w2)
    assert torch.equal(y, y_want) and torch.equal(xfull, xfull_want)
    for i in range(b):
        assert torch.equal(windows[i], xfull_want[i, t:])
    ref_windows = [window[i].clone() for i in range(b)]
    _, xfull_ref = conv_ref.conv_sessions(x, ref_windows, w2)
    assert torch.equal(xfull_ref, xfull_want)
    for i in range(b):
        assert torch.equal(ref_windows[i], windows[i])


@pytest.mark.parametrize("b, t", [(2, 3), (3, 1)])
def test_conv_reads_the_windows_through_any_table_column(b, t):
    """column: batch b's window lies at table row b's `column` (a PLE table's conv tails at
    column 0, dilation 3, a drafted step's window of t rows): y and xfull bitwise those of
    the stacked windows, the windows untouched without shift."""
    from flashlane.kernels.session_tables import offsets_table

    c, k, dil = 40, 4, 3
    x, window, weight = _inputs(b, t, c, k, dil)
    w2 = weight[:, 0, :]
    windows = [window[i].clone() for i in range(b)]  # each its own buffer
    table = offsets_table([windows], align=[1])
    y_want, xfull_want = conv_tri.causal_conv(x, window.clone(), w2, dilation=dil)
    y, xfull = conv_tri.causal_conv(x, windows[0][None], w2, dil, table=table, column=0)
    assert torch.equal(y, y_want) and torch.equal(xfull, xfull_want)
    for i in range(b):
        assert torch.equal(windows[i], window[i])
