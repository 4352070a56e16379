"""chunk_gdn vs recurrent_gdn vs transformers' torch GDN functions."""

import pytest
import torch
from transformers.models.qwen4_exp import modeling_qwen4_exp as hf

from flashlane.kernels.gdn.reference import chunk_gdn, gdn_sessions, recurrent_gdn
from flashlane.kernels.norms.reference import l2norm
from flashlane.kernels.rowwise.reference import gdn_gates


def inputs(b, t, h=3, dk=16, dv=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, dk, generator=g, dtype=torch.float64)
    k = torch.randn(b, t, h, dk, generator=g, dtype=torch.float64)
    v = torch.randn(b, t, h, dv, generator=g, dtype=torch.float64)
    gate = -torch.rand(b, t, h, generator=g, dtype=torch.float64) * 2
    beta = torch.rand(b, t, h, generator=g, dtype=torch.float64)
    s0 = torch.randn(b, h, dk, dv, generator=g, dtype=torch.float64) * 0.1
    return q, k, v, gate, beta, s0


def ours_inputs(q, k):
    return l2norm(q) * q.shape[-1] ** -0.5, l2norm(k)


@pytest.mark.parametrize("t", [1, 63, 64, 65, 200])
def test_chunk_equals_recurrent_and_oracle(t):
    q, k, v, g, beta, s0 = inputs(2, t)
    qn, kn = ours_inputs(q, k)
    o_c, s_c = chunk_gdn(qn, kn, v, g, beta, s0)
    o_r, states = recurrent_gdn(qn, kn, v, g, beta, s0)
    o_hf, s_hf = hf.torch_chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    o_hr, s_hr = hf.torch_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=s0, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    torch.testing.assert_close(o_c, o_r, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(s_c, states[:, -1], rtol=1e-9, atol=1e-9)
    # transformers computes in fp32
    for o, s in ((o_hf, s_hf), (o_hr, s_hr)):
        torch.testing.assert_close(o_c, o.to(o_c.dtype), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s_c, s.to(s_c.dtype), rtol=1e-5, atol=1e-5)


def test_varlen_pieces_equal_one_call():
    """Pieces at multiples of 64 carrying the state equal one call over the whole sequence."""
    q, k, v, g, beta, s0 = inputs(1, 150, seed=1)
    qn, kn = ours_inputs(q, k)
    whole, s_whole = chunk_gdn(qn, kn, v, g, beta, s0)
    s, outs = s0, []
    for a, b in ((0, 64), (64, 128), (128, 150)):
        o, s = chunk_gdn(qn[:, a:b], kn[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], s)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), whole, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_whole, rtol=1e-10, atol=1e-10)


def test_recurrent_states_per_row_are_prefix_states():
    q, k, v, g, beta, s0 = inputs(1, 7, seed=2)
    qn, kn = ours_inputs(q, k)
    _, states = recurrent_gdn(qn, kn, v, g, beta, s0)
    for r in range(7):
        _, last = recurrent_gdn(
            qn[:, : r + 1],
            kn[:, : r + 1],
            v[:, : r + 1],
            g[:, : r + 1],
            beta[:, : r + 1],
            s0,
            keep_states=False,
        )
        assert torch.equal(states[:, r], last[:, 0])


def test_no_unwritten_outputs():
    q, k, v, g, beta, _ = inputs(2, 65, seed=3)
    o, s = chunk_gdn(*ours_inputs(q, k), v, g, beta, None)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gates_inside_are_gdn_gates_then_the_rule(dtype):
    """gates=(a, b, A_log, dt_bias): the references compute gdn_gates, then the rule, so the
    values are those of the gates passed in, bit for bit (a, b column slices of one
    projection; softplus's linear branch and a very negative a among them)."""
    b, t, h = 2, 3, 3
    q, k, v, _, _, s0 = inputs(b, t, h=h, seed=4)
    q, k, v = (x.to(dtype) for x in (*ours_inputs(q, k), v))
    gen = torch.Generator().manual_seed(5)
    proj = (torch.randn(b * t, 2 * h + 4, generator=gen) * 4).to(dtype)
    proj[0, 2 + h], proj[1, 2 + h] = 30.0, -90.0
    bb, a = (proj[:, 2 + i * h : 2 + (i + 1) * h].unflatten(0, (b, t)) for i in range(2))
    a_log, dt_bias = torch.rand(h, generator=gen) * 2.77, torch.randn(h, generator=gen).to(dtype)
    g, beta = gdn_gates(a, bb, a_log, dt_bias)
    gates = (a, bb, a_log, dt_bias)
    want = recurrent_gdn(q, k, v, g, beta, s0)
    got = recurrent_gdn(q, k, v, None, None, s0, gates=gates)
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    states, want_states = list(s0.clone()), list(s0.clone())
    want_o = gdn_sessions(q, k, v, g, beta, want_states)
    assert torch.equal(gdn_sessions(q, k, v, None, None, states, gates=gates), want_o)
    assert all(torch.equal(x, y) for x, y in zip(states, want_states))
