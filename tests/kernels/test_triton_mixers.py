"""Triton GDN kernels vs the torch references, and their row invariance.

A row's output must be bitwise the same whatever the call's width T, the row's offset in it,
and whatever the other rows and batch entries hold. On the CPU the interpreter runs small
shapes in fp32; on a GPU the shapes are the model's (48 value heads of 128 x 128) in fp32
and bf16. (The attention and indexer kernels: test_triton_attention.py.)

Tolerances against the references: fp32 1e-5 (the reductions run in another order); bf16
inputs on the GPU against the fp32 reference on the same (rounded) inputs: the GDN states,
fp32 in both, 1e-4; outputs rounded to bf16 2e-2. fla's chunked GDN (GPU only): RMS error
ratio 5e-3 (fp32, tf32 dots) and 1e-2 (bf16).
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DEVICE, DTYPES, HAS_CUDA, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.gdn import fla_chunk
from flashlane.kernels.gdn import reference as gdn_ref
from flashlane.kernels.gdn import triton as gdn_tri

pytestmark = needs_triton

# (H, Dk, Dv): real sizes on the GPU; small and awkward (Dv over two partial blocks) on the CPU
GDN_SHAPES = [(48, 128, 128), (4, 16, 48)] if HAS_CUDA else [(4, 16, 48), (2, 24, 32)]


def tols(dtype):
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 2e-2, "atol": 2e-2}


def state_tols(dtype):
    return {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-4, "atol": 1e-4}


# ---------------------------------------------------------------------------- GDN


def gdn_inputs(b, t, h, dk, dv, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, t, h, dk, generator=gen), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(b, t, h, dk, generator=gen), dim=-1)
    v = torch.randn(b, t, h, dv, generator=gen)
    g = -torch.rand(b, t, h, generator=gen) * 2
    beta = torch.rand(b, t, h, generator=gen)
    s0 = torch.randn(b, h, dk, dv, generator=gen) * 0.1
    xs = [x.to(DEVICE, dtype) for x in (q, k, v, g, beta)]
    return (*xs, s0.to(DEVICE))


def as_fp32(*xs):
    return [x.float() for x in xs]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", GDN_SHAPES)
@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("t", [1, 2, 5, 16])
def test_recurrent_gdn_matches_reference(t, b, shape, dtype):
    h, dk, dv = shape
    q, k, v, g, beta, s0 = gdn_inputs(b, t, h, dk, dv, dtype, seed=t * 10 + b)
    o, states = gdn_tri.recurrent_gdn(q, k, v, g, beta, s0)
    o_ref, states_ref = gdn_ref.recurrent_gdn(*as_fp32(q, k, v, g, beta), s0)
    assert o.dtype == dtype and states.dtype == torch.float32
    assert states.shape == (b, t, h, dk, dv)
    torch.testing.assert_close(o.float(), o_ref, **tols(dtype))
    torch.testing.assert_close(states, states_ref, **state_tols(dtype))
    # keep_states=False: only the last state, bitwise the last of the kept ones
    o2, last = gdn_tri.recurrent_gdn(q, k, v, g, beta, s0, keep_states=False)
    assert last.shape == (b, 1, h, dk, dv)
    assert torch.equal(o2, o) and torch.equal(last[:, 0], states[:, -1])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t, keep", [(1, True), (4, False)])
def test_recurrent_gdn_state_in_place(t, keep, dtype):
    """out = the state itself (the lone step): o and the new state bitwise those of a call
    that writes a fresh tensor; a wrong out is refused."""
    h, dk, dv = GDN_SHAPES[0]
    q, k, v, g, beta, s0 = gdn_inputs(2, t, h, dk, dv, dtype, seed=11)
    o, states = gdn_tri.recurrent_gdn(q, k, v, g, beta, s0, keep_states=keep)
    state = s0.clone()
    o2, got = gdn_tri.recurrent_gdn(q, k, v, g, beta, state, keep_states=keep, out=state[:, None])
    assert got.data_ptr() == state.data_ptr()
    assert torch.equal(o2, o) and torch.equal(state, states[:, -1])
    with pytest.raises(ValueError, match="out must be"):
        gdn_tri.recurrent_gdn(q, k, v, g, beta, s0, keep_states=keep, out=s0[:1, None])


@pytest.mark.parametrize("b, t", [(1, 1), (3, 1), (2, 3)])
def test_recurrent_gdn_reads_strided_values_where_they_lie(b, t):
    """v as the conv output's column slice ([B, T, H, Dv] rows of a wider tensor): read in
    place, o and states bitwise those of a contiguous v; gdn_sessions the same."""
    h, dk, dv = GDN_SHAPES[0]
    q, k, v, g, beta, s0 = gdn_inputs(b, t, h, dk, dv, torch.float32, seed=12)
    wide = torch.zeros(b, t, h * dv + 24, device=v.device, dtype=v.dtype)
    wide[..., 16 : 16 + h * dv] = v.reshape(b, t, h * dv)
    strided = wide[..., 16 : 16 + h * dv].reshape(b, t, h, dv)
    assert not strided.is_contiguous() or b * t == 1
    o, states = gdn_tri.recurrent_gdn(q, k, v, g, beta, s0)
    o2, states2 = gdn_tri.recurrent_gdn(q, k, strided, g, beta, s0)
    assert torch.equal(o2, o) and torch.equal(states2, states)
    sessions = [s0[i].clone() for i in range(b)]
    o3 = gdn_tri.gdn_sessions(q, k, strided, g, beta, sessions)
    assert torch.equal(o3, o)
    for i in range(b):
        assert torch.equal(sessions[i], states[i, -1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_recurrent_gdn_without_state(dtype):
    h, dk, dv = GDN_SHAPES[0]
    q, k, v, g, beta, _ = gdn_inputs(2, 3, h, dk, dv, dtype, seed=7)
    o, states = gdn_tri.recurrent_gdn(q, k, v, g, beta, None)
    o_ref, states_ref = gdn_ref.recurrent_gdn(*as_fp32(q, k, v, g, beta), None)
    torch.testing.assert_close(o.float(), o_ref, **tols(dtype))
    torch.testing.assert_close(states, states_ref, **state_tols(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_recurrent_gdn_row_invariance(dtype):
    h, dk, dv = GDN_SHAPES[0]
    t = 16
    q, k, v, g, beta, s0 = gdn_inputs(3, t, h, dk, dv, dtype, seed=3)
    o, states = gdn_tri.recurrent_gdn(q, k, v, g, beta, s0)
    # one stream alone equals the same stream among three
    for i in range(3):
        sl = slice(i, i + 1)
        oi, si = gdn_tri.recurrent_gdn(q[sl], k[sl], v[sl], g[sl], beta[sl], s0[sl])
        assert torch.equal(oi, o[sl]) and torch.equal(si, states[sl])
    # the first r rows of a width-16 window equal a width-r window
    for r in (1, 2, 5, 15):
        o_r, s_r = gdn_tri.recurrent_gdn(q[:, :r], k[:, :r], v[:, :r], g[:, :r], beta[:, :r], s0)
        assert torch.equal(o_r, o[:, :r]) and torch.equal(s_r, states[:, :r])
        _, last = gdn_tri.recurrent_gdn(
            q[:, :r], k[:, :r], v[:, :r], g[:, :r], beta[:, :r], s0, keep_states=False
        )
        assert torch.equal(last[:, 0], states[:, r - 1])
    # a window that starts from a kept state continues bitwise
    a = 5
    o_b, s_b = gdn_tri.recurrent_gdn(
        q[:, a:], k[:, a:], v[:, a:], g[:, a:], beta[:, a:], states[:, a - 1]
    )
    assert torch.equal(o_b, o[:, a:]) and torch.equal(s_b, states[:, a:])


def test_chunk_gdn_falls_back_without_fla_on_cpu():
    q, k, v, g, beta, s0 = (x.cpu() for x in gdn_inputs(1, 70, 2, 16, 8, torch.float32))
    o, s = fla_chunk.chunk_gdn(q, k, v, g, beta, s0)
    o_ref, s_ref = gdn_ref.chunk_gdn(q, k, v, g, beta, s0)
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref)


@pytest.mark.skipif(not HAS_CUDA, reason="fla's chunked kernels need a GPU")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 64, 150])
@pytest.mark.parametrize("with_state", [True, False])
def test_chunk_gdn_fla_matches_reference(t, dtype, with_state):
    pytest.importorskip("fla.ops.gated_delta_rule")
    h, dk, dv = GDN_SHAPES[0]
    q, k, v, g, beta, s0 = gdn_inputs(2, t, h, dk, dv, dtype, seed=t)
    s0 = s0 if with_state else None
    o, s = fla_chunk.chunk_gdn(q, k, v, g, beta, s0)
    o_ref, s_ref = gdn_ref.chunk_gdn(*as_fp32(q, k, v, g, beta), s0)
    assert o.dtype == dtype and s.dtype == torch.float32 and s.shape == s_ref.shape
    # fla's fp32 dots may run in tf32, and in bf16 it keeps its chunk intermediates in bf16:
    # compare by the error's RMS relative to the reference's (as fla's own tests do), 5e-3 in
    # fp32 and 1e-2 in bf16, and bound the largest error loosely
    ratio = 5e-3 if dtype == torch.float32 else 1e-2
    for got, want in ((o.float(), o_ref), (s, s_ref)):
        err = (got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt().clamp_min(1e-12)
        assert err < ratio, float(err)
        torch.testing.assert_close(got, want, rtol=0.1, atol=0.1)


def test_chunk_gdn_pieces_on_cpu_run_each_alone():
    """lengths: [1, sum] rows of several sequences; the reference runs each as its own call."""
    lengths = [70, 1, 64, 5]
    q, k, v, g, beta, _ = (x.cpu() for x in gdn_inputs(1, sum(lengths), 2, 16, 8, torch.float32))
    s0 = torch.randn(len(lengths), 2, 16, 8, generator=torch.Generator().manual_seed(1))
    o, s = fla_chunk.chunk_gdn(q, k, v, g, beta, s0, lengths=lengths)
    at = 0
    for i, n in enumerate(lengths):
        part = (x[:, at : at + n] for x in (q, k, v, g, beta))
        o_i, s_i = gdn_ref.chunk_gdn(*part, s0[i : i + 1])
        assert torch.equal(o[:, at : at + n], o_i) and torch.equal(s[i : i + 1], s_i)
        at += n
    with pytest.raises(ValueError, match="do not tile"):
        fla_chunk.chunk_gdn(q, k, v, g, beta, s0, lengths=[70, 1, 64])


@pytest.mark.skipif(not HAS_CUDA, reason="fla's chunked kernels need a GPU")
@pytest.mark.parametrize("dtype", DTYPES)
def test_chunk_gdn_pieces_bits_alone_first_last_beside(dtype):
    """A piece's output and final state are bitwise the same alone, first, last and between
    others in one varlen call, and the [B, T] form is the varlen one."""
    pytest.importorskip("fla.ops.gated_delta_rule")
    h, dk, dv = GDN_SHAPES[0]
    lengths = [150, 64, 1, 70, 200]
    q, k, v, g, beta, _ = gdn_inputs(1, sum(lengths), h, dk, dv, dtype, seed=3)
    s0 = torch.randn(len(lengths), h, dk, dv, generator=torch.Generator().manual_seed(4))
    s0 = s0.to(DEVICE) * 0.1
    starts = [sum(lengths[:i]) for i in range(len(lengths))]

    def piece(i):
        return [x[:, starts[i] : starts[i] + lengths[i]] for x in (q, k, v, g, beta)]

    alone = [
        fla_chunk.chunk_gdn(*piece(i), s0[i : i + 1], lengths=[n]) for i, n in enumerate(lengths)
    ]
    o, s = fla_chunk.chunk_gdn(q, k, v, g, beta, s0, lengths=lengths)
    for i, (o_i, s_i) in enumerate(alone):
        assert torch.equal(o[:, starts[i] : starts[i] + lengths[i]], o_i), i
        assert torch.equal(s[i : i + 1], s_i), i
    order = list(reversed(range(len(lengths))))  # first becomes last
    cat = [torch.cat([piece(i)[j] for i in order], dim=1) for j in range(5)]
    o_r, s_r = fla_chunk.chunk_gdn(*cat, s0[order], lengths=[lengths[i] for i in order])
    at = 0
    for slot, i in enumerate(order):
        assert torch.equal(o_r[:, at : at + lengths[i]], alone[i][0]), i
        assert torch.equal(s_r[slot : slot + 1], alone[i][1]), i
        at += lengths[i]
    o_b, s_b = fla_chunk.chunk_gdn(*piece(0), s0[:1])  # no lengths: the same call
    assert torch.equal(o_b, alone[0][0]) and torch.equal(s_b, alone[0][1])
    o_ref, s_ref = gdn_ref.chunk_gdn(*as_fp32(*piece(0)), s0[:1])
    torch.testing.assert_close(o_b.float(), o_ref, rtol=0.1, atol=0.1)
    torch.testing.assert_close(s_b, s_ref, rtol=0.1, atol=0.1)
