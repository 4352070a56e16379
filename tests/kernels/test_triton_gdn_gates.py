"""The recurrent GDN kernel with the gates inside (gates=(a, b, A_log, dt_bias)) against
gdn_gates then the kernel on its g and beta: the same ops in the same order with the same
roundings (rowwise/triton.py gdn_gate_values, one helper for both), so the outputs and the
states are bit for bit the same. a and b are column slices of a wider projection, read
where they lie; a + dt_bias spans softplus's linear branch (> 20) and very negative values.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import DEVICE, DTYPES, HAS_CUDA, needs_triton

pytest.importorskip("triton")

from flashlane.kernels.gdn import triton as gdn_tri
from flashlane.kernels.rowwise import triton as rowwise_tr
from flashlane.models.state import offsets_table

pytestmark = needs_triton

# (H, Dk, Dv): the model's on the GPU; small, Dv over two partial blocks, on the CPU
H, DK, DV = (48, 128, 128) if HAS_CUDA else (4, 16, 48)
LEFT, RIGHT = 7, 3  # projection columns before b and after a


def gate_inputs(b, t, dtype, seed):
    """(q, k, v [B, T, H, D]; a, b [B, T, H]: column slices of one projection; A_log fp32,
    dt_bias in dtype), with a + dt_bias past 20 and far below 0 in some heads."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, t, H, DK, generator=gen), dim=-1) * DK**-0.5
    k = torch.nn.functional.normalize(torch.randn(b, t, H, DK, generator=gen), dim=-1)
    v = torch.randn(b, t, H, DV, generator=gen)
    proj = torch.randn(b * t, LEFT + 2 * H + RIGHT, generator=gen) * 4
    proj[0, LEFT + H] = 30.0  # a: softplus's linear branch
    proj[-1, LEFT + H + 1] = 25.0
    proj[0, LEFT + H + 2] = -90.0  # a: softplus underflows to 0 (no decay)
    proj[-1, LEFT] = -120.0  # b: sigmoid 0 (no update)
    proj[0, LEFT + 1] = 60.0  # b: sigmoid 1
    a_log = torch.rand(H, generator=gen) * 2.77  # A in [1, 16]
    dt_bias = torch.randn(H, generator=gen)
    q, k, v, proj, dt_bias = (x.to(DEVICE, dtype) for x in (q, k, v, proj, dt_bias))
    b_in = proj[:, LEFT : LEFT + H].unflatten(0, (b, t))
    a_in = proj[:, LEFT + H : LEFT + 2 * H].unflatten(0, (b, t))
    return q, k, v, a_in, b_in, a_log.to(DEVICE), dt_bias


def gates_of(a, b, a_log, dt_bias, gates=rowwise_tr.gdn_gates):
    """gdn_gates on the [B * T, H] rows (their launch), back as [B, T, H]."""
    g, beta = gates(a.flatten(0, 1), b.flatten(0, 1), a_log, dt_bias)
    return g.view(a.shape), beta.view(b.shape)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b", [1, 2])
@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("keep", [True, False])
def test_recurrent_gates_inside_are_the_gates_launch(dtype, b, t, keep):
    q, k, v, a, bb, a_log, dt_bias = gate_inputs(b, t, dtype, seed=10 * b + t)
    assert gdn_tri._rows(a)[0] is a and gdn_tri._rows(bb)[0] is bb  # read where they lie
    s0 = torch.randn(b, H, DK, DV, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    g, beta = gates_of(a, bb, a_log, dt_bias)
    assert bool((g == 0).any())  # softplus's underflow is in play
    want_o, want_s = gdn_tri.recurrent_gdn(q, k, v, g, beta, s0, keep_states=keep)
    got_o, got_s = gdn_tri.recurrent_gdn(
        q, k, v, None, None, s0, keep_states=keep, gates=(a, bb, a_log, dt_bias)
    )
    assert torch.equal(got_o, want_o)
    assert torch.equal(got_s, want_s)


@pytest.mark.parametrize("dtype", DTYPES)
def test_recurrent_gates_inside_state_in_place(dtype):
    """The lone step's call: one session's state read and written in place."""
    q, k, v, a, bb, a_log, dt_bias = gate_inputs(1, 1, dtype, seed=3)
    s0 = torch.randn(1, H, DK, DV, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    want_o, want_s = gdn_tri.recurrent_gdn(q, k, v, *gates_of(a, bb, a_log, dt_bias), s0)
    state = s0.clone()
    got_o, got_s = gdn_tri.recurrent_gdn(
        q, k, v, None, None, state, out=state[:, None], gates=(a, bb, a_log, dt_bias)
    )
    assert torch.equal(got_o, want_o)
    assert torch.equal(state, want_s[:, 0]) and got_s.data_ptr() == state.data_ptr()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3])
def test_sessions_gates_inside_are_the_gates_launch(dtype, t):
    b = 3
    q, k, v, a, bb, a_log, dt_bias = gate_inputs(b, t, dtype, seed=20 + t)
    gen = torch.Generator().manual_seed(4)
    states = [torch.randn(H, DK, DV, generator=gen).to(DEVICE) for _ in range(b)]
    want_states = [s.clone() for s in states]
    want = gdn_tri.gdn_sessions(
        q, k, v, *gates_of(a, bb, a_log, dt_bias), want_states, offsets_table([want_states])
    )
    got = gdn_tri.gdn_sessions(
        q, k, v, None, None, states, offsets_table([states]), gates=(a, bb, a_log, dt_bias)
    )
    assert torch.equal(got, want)
    for s, w in zip(states, want_states):
        assert torch.equal(s, w)
