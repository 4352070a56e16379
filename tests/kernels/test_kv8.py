"""kernels/attention/kv8.py, the 8-bit KV cache's rows, and the reference attend_sessions over
8-bit caches (the CPU's and the oracle's path): a row's stored bits are its own, a zero row
is exact, the error is within half an e4m3 step of the row's largest value, and B sessions'
rows in one call are each session's alone."""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.attention import kv8
from flashlane.kernels.attention import reference as attn_ref
from flashlane.models.state import AttnCache


class _Cfg:
    num_kv_heads, head_dim, indexer_head_dim, indexer_block = 2, 32, 16, 4


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_each_row_is_quantized_alone(dtype):
    x = (torch.randn(9, 2, 32, generator=torch.Generator().manual_seed(1)) * 5).to(dtype)
    x[3, 1] = 0
    x[4, 0, :5] = 1e-30  # tiny: the scale's floor keeps them finite
    q, s = kv8.quantize(x)
    assert q.dtype == kv8.FP8 and s.dtype == torch.float32 and s.shape == (9, 2)
    for i in range(9):
        qi, si = kv8.quantize(x[i : i + 1])
        assert torch.equal(qi.view(torch.uint8), q[i : i + 1].view(torch.uint8))
        assert torch.equal(si, s[i : i + 1])
    back = kv8.dequantize(q, s, torch.float64)
    assert torch.isfinite(back).all()
    assert torch.equal(back[3, 1], torch.zeros(32, dtype=torch.float64))
    # e4m3 keeps 3 mantissa bits: half a step at the top binade (256..448, steps of 32) is
    # 16 scales, 16 / 448 of the row's largest value (and the fp32 product's rounding)
    bound = 16 * s.double()[..., None] + back.abs() * 2**-23
    assert ((back - x.double()).abs() <= bound).all()
    assert (s.double() <= x.double().abs().amax(-1) / 448 * (1 + 2**-23) + 2**-126).all()


def caches(capacities, seed):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for cap in capacities:
        c = AttnCache.empty(_Cfg, cap, torch.float64, "cpu", fp8=True)
        for t, scale in ((c.k, c.k_scale), (c.v, c.v_scale), (c.index_keys, c.index_scale)):
            q, s = kv8.quantize(torch.randn(t.shape, generator=gen, dtype=torch.float64))
            t.copy_(q)
            scale.copy_(s)
        c.block_keys.copy_(torch.randn(c.block_keys.shape, generator=gen, dtype=torch.float64))
        out.append(c)
    return out


def test_sessions_in_one_call_are_each_alone():
    base = caches([24, 64, 8], seed=2)
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(3, h, 32, generator=gen, dtype=torch.float64) for h in (6, 2, 2))
    iq, raw = torch.randn(3, 2, 16, generator=gen), torch.randn(3, 16, generator=gen)
    iq, raw = iq.double(), raw.double()
    cos, sin, w = torch.randn(3, 8).double(), torch.randn(3, 8).double(), torch.randn(16).double()
    pos = torch.tensor([19, 40, 3])
    rest = (1e-6, 4, 2, 0.125)
    together = [AttnCache(*(t.clone() for t in c.tensors())) for c in base]
    got = attn_ref.attend_sessions(q, k, v, iq, raw, together, pos, cos, sin, w, *rest)
    for i, c in enumerate(base):
        one = slice(i, i + 1)
        alone = AttnCache(*(t.clone() for t in c.tensors()))
        want = attn_ref.attend_sessions(
            q[one], k[one], v[one], iq[one], raw[one], [alone], pos[one], cos[one], sin[one], w,
            *rest,
        )  # fmt: skip
        assert torch.equal(got[one], want)
        for x, y in zip(together[i].tensors(), alone.tensors()):
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))
        # the row was stored quantized: its bytes and scale are kv8.quantize's
        qk, sk = kv8.quantize(k[one])
        assert torch.equal(alone.k[pos[i]].view(torch.uint8), qk[0].view(torch.uint8))
        assert torch.equal(alone.k_scale[pos[i]], sk[0])
