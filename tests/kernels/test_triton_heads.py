"""The attention's queries, keys and indexer queries normed and roped in one launch
(kernels/rowwise/triton_heads.py) against the two launches it replaces, norms' rms_norm then
rowwise's rope for each part: bit for bit. And against the torch reference (tolerance).

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_heads.py`
(fp32); on a GPU also bf16.
"""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.rowwise import reference as ref
from tests.kernels.triton_env import DEVICE, DTYPES, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.norms import triton as trn  # noqa: E402
from flashlane.kernels.rowwise import triton_heads as trh  # noqa: E402
from flashlane.kernels.rowwise import triton_rope as trope  # noqa: E402

TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2}
EPS = 1e-6


def _rand(*shape, dtype, seed, scale=2.0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dtype)


def _parts(n, dtype, hq, hk, hi, d, di, seed=0):
    """Flash Next's three parts at these sizes, laid out as the layer reads them: q the first
    d of each head's 2d projection values (strided), k and the indexer queries column slices
    of the stacked projection [n, hq*2d + hk*d + (hi+1)*di]."""
    width = hq * 2 * d + hk * d + (hi + 1) * di
    proj = _rand(n, width, dtype=dtype, seed=seed)
    q = proj[:, : hq * 2 * d].reshape(n, hq, 2 * d)[..., :d]
    k = proj[:, hq * 2 * d : hq * 2 * d + hk * d].reshape(n, hk, d)
    iq = proj[:, hq * 2 * d + hk * d : -di].reshape(n, hi, di)
    ws = [_rand(w, dtype=dtype, seed=seed + i + 1, scale=0.3) for i, w in enumerate((d, d, di))]
    return [(x, w, EPS) for x, w in zip((q, k, iq), ws)]


def _cos_sin(n, r, dtype, seed=9):
    angle = _rand(n, r // 2, dtype=torch.float32, seed=seed, scale=3.0)
    angle = torch.cat([angle, angle], dim=-1)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def _separate(parts, cos, sin):
    """Today's launches: rms_norm, then rope, for each part."""
    return [trope.rope(trn.rms_norm(x, w, eps), cos, sin) for x, w, eps in parts]


def _check(parts, cos, sin, dtype):
    got = trh.norm_rope_heads(parts, cos, sin)
    for out, want, (x, _, _) in zip(got, _separate(parts, cos, sin), parts):
        assert out.shape == x.shape and out.dtype == x.dtype and out.is_contiguous()
        assert torch.equal(out, want)
    for out, want in zip(got, ref.norm_rope_heads(parts, cos, sin)):
        err = (out.double() - want.double()).abs().max() / want.double().abs().max()
        assert err.item() <= TOL[dtype], f"relative error {err.item():.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 17])
def test_flash_next_parts_bit_for_bit(dtype, n):
    """q [n, 24, 256] (a column slice), k [n, 2, 256], iq [n, 4, 128]; 64 rotated columns
    (partial rotary 0.25 of 256)."""
    parts = _parts(n, dtype, 24, 2, 4, 256, 128, seed=n)
    assert parts[0][0].stride()[1:] == (512, 1)  # a column slice, read in place
    _check(parts, *_cos_sin(n, 64, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 3, 17])
def test_small_parts_bit_for_bit(dtype, n):
    """Widths off the power-of-two block (20 and 12 in blocks of 32 and 16), 8 rotated."""
    parts = _parts(n, dtype, 3, 1, 2, 20, 12, seed=40 + n)
    _check(parts, *_cos_sin(n, 8, dtype), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_part_and_copied_parts(dtype):
    """One part alone (the indexer's split), and parts whose rows are not evenly spaced or
    whose columns are strided: copied first, the same bits."""
    n = 5
    cos, sin = _cos_sin(n, 8, dtype)
    x = _rand(n, 3, 16, dtype=dtype, seed=60)
    w = _rand(16, dtype=dtype, seed=61, scale=0.3)
    _check([(x, w, EPS)], cos, sin, dtype)
    odd = _rand(16, 3, n, dtype=dtype, seed=62).permute(2, 1, 0)  # column stride n*3
    _check([(odd, w, EPS), (x, w, 1e-5)], cos, sin, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_invariant(dtype):
    """A row's outputs are bitwise the same whatever the rows around it in the call."""
    n = 9
    parts = _parts(n, dtype, 3, 1, 2, 20, 12, seed=70)
    cos, sin = _cos_sin(n, 8, dtype)
    whole = trh.norm_rope_heads(parts, cos, sin)
    for o, m in ((0, 1), (4, 1), (2, 5)):
        sub = [(x[o : o + m], w, eps) for x, w, eps in parts]
        for got, want in zip(trh.norm_rope_heads(sub, cos[o : o + m], sin[o : o + m]), whole):
            assert torch.equal(got, want[o : o + m]), (o, m)


def test_no_rows():
    parts = _parts(0, torch.float32, 3, 1, 2, 20, 12)
    cos, sin = _cos_sin(0, 8, torch.float32)
    assert [t.shape for t in trh.norm_rope_heads(parts, cos, sin)] == [
        (0, 3, 20),
        (0, 1, 20),
        (0, 2, 12),
    ]


def test_attention_project_is_the_separate_launches():
    """QSAttention.project on the Triton kernels (the tiny config, random weights): its q, k
    and indexer queries are rms_norm then rope of the projection's columns, bit for bit."""
    from flashlane.kernels.gpu import TRITON
    from flashlane.models.config import ModelConfig
    from flashlane.models.layers.qsa_attention import QSAttention
    from flashlane.models.presets import preset

    cfg = ModelConfig.from_hf(preset("flashnext-tiny"))
    torch.manual_seed(0)
    attn = QSAttention(cfg, lambda session: None).to(DEVICE)
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    attn.ops = attn.indexer.ops = TRITON
    n, d, di = 3, cfg.head_dim, cfg.indexer_head_dim
    x = _rand(n, cfg.hidden_size, dtype=torch.float32, seed=80)
    cos, sin = _cos_sin(n, cfg.rotary_dim, torch.float32)
    q, gate, k, v, iq, raw = attn.project(x, cos, sin)
    qg, kk, vv, iqk = attn.in_proj(x)
    want = [
        (qg.reshape(n, -1, 2 * d)[..., :d], attn.q_norm),
        (kk.reshape(n, -1, d), attn.k_norm),
        (iqk[:, :-di].reshape(n, -1, di), attn.indexer.q_layernorm),
    ]
    for got, (part, norm) in zip((q, k, iq), want):
        assert torch.equal(got, trope.rope(trn.rms_norm(part, norm.weight, norm.eps), cos, sin))
    assert torch.equal(raw, iqk[:, -di:]) and torch.equal(v, vv.reshape(n, -1, d))
    assert torch.equal(gate, qg.reshape(n, -1, 2 * d)[..., d:])
