"""e4m3 weight tiles as the decode tiles' dots read them (kernels/linear/triton_fp8.py's
`scaled_dot`): converted to bf16 by bits (`bf16_of_e4m3`) or by Triton (`weight_operand`), or
to f16 with the activations scaled into f16 by a power of two a row (`f16_dot`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def bf16_of_e4m3(b):
    """The e4m3 values b as bf16, exactly, four at a time in the integer and bf16x2 units.
    Triton's own conversion goes e4m3x2 -> f16x2 -> one F2F a value (the SASS: 64 F2F a K
    block a thread), and conversions run at 16 a clock per SM (NVIDIA's throughput table):
    by that estimate a bound near 2.4 TB/s at one row, where the H200 measured 1.0-2.2.
    Here each byte goes to the top of a 16-bit half (prmt), its sign kept and its exponent
    and mantissa moved down by 4: the bf16 of value * 2^-120 (exponent fields line up:
    e4m3's bias 7, bf16's 127; its subnormals land on bf16's subnormals, the same ratio),
    then one bf16x2 multiply by 2^120, exact. The NaN
    codes (0x7F, 0xFF: no checkpoint holds them) come out as +-480."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 lo, hi, t, up;
        prmt.b32 lo, $2, 0, 0x1404;
        prmt.b32 hi, $2, 0, 0x3424;
        mov.b32 up, 0x7B807B80;
        shr.b32 t, lo, 4;
        and.b32 t, t, 0x07F007F0;
        and.b32 lo, lo, 0x80008000;
        or.b32 lo, lo, t;
        mul.rn.bf16x2 $0, lo, up;
        shr.b32 t, hi, 4;
        and.b32 t, t, 0x07F007F0;
        and.b32 hi, hi, 0x80008000;
        or.b32 hi, hi, t;
        mul.rn.bf16x2 $1, hi, up;
        }""",
        "=r,=r,r",
        [b.to(tl.uint8, bitcast=True)],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def weight_operand(b, a, BY_BITS: tl.constexpr):
    """The e4m3 tile b in a's dtype for the dot: by bits (bf16_of_e4m3) or by Triton."""
    if BY_BITS:
        out = bf16_of_e4m3(b)
    else:
        out = b.to(a.dtype)
    return out


@triton.jit
def f16_dot(a, b):
    """(a . b as f16 products summed in fp32, each row's power of two): a [M, K] (bf16 / fp16)
    times 2^-e a row, e from the row's largest magnitude so that it lands in [2^14, 2^15),
    exact in f16 (values under 2^-24 of it round to f16's subnormals); b e4m3, exact in f16.
    The dot times 2^e is a . b up to those roundings (0 for a row of zeros: e = 0)."""
    big = tl.max(tl.abs(a.to(tl.float32)), axis=1)
    exp = (big.to(tl.int32, bitcast=True) >> 23) & 0xFF  # the biased exponent
    e = tl.where(big > 0, tl.minimum(tl.maximum(exp - 141, -126), 126), 0)
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2^-e
    up = ((127 + e) << 23).to(tl.float32, bitcast=True)  # 2^e
    a16 = (a.to(tl.float32) * down[:, None]).to(tl.float16)
    return tl.dot(a16, b.to(tl.float16)), up
