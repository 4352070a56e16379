"""Gated DeltaNet in Triton: the recurrent form (verify rows); fla_chunk.py the chunked form.

Same signatures and conventions as flashlane.kernels.gdn.reference (q, k L2-normalised, q
scaled, value heads matched). Importing this module needs triton.

recurrent_gdn: one program per (Dv block, b, h). The state tile [Dk, BV] (fp32) stays in
registers across the T rows, which are processed in order; the state after every row is
stored. Each (b, h, Dv block) is independent and row r reads nothing past row r, so the
result of a row is bitwise the same whatever T, B or the other sequences hold. BV is fixed
(never chosen by T or B) and T is not specialised on, so one compiled kernel serves all T.
keep_states is a runtime flag, not a constexpr: two compiled variants were seen on the H200
to lay out the state tile differently in bf16, so the sums over Dk ran in another order and
the last state of keep_states=False differed in its low bits from the kept one.

gates=(a, b, A_log, dt_bias) in place of g and beta: each program computes its head's g and
beta per row from a and b (column slices of the input projection, read where they lie) with
gdn_gates' own arithmetic (rowwise/triton.py gdn_gate_values), so the bits of gdn_gates then
the kernel, without the gates' launch (a decode step's GDN layers ran it 9 times).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from flashlane.kernels.norms.triton import rows_view
from flashlane.kernels.pdl import enter, pdl
from flashlane.kernels.rowwise.triton import gdn_gate_values
from flashlane.kernels.session_tables import offsets_table
from flashlane.kernels.tables import TABLE_WIDTH, no_table

# Dv block of the recurrent kernel: a [128, 32] fp32 state tile is 32 registers per thread
# with 4 warps, and Dv = 128 gives 4 programs per (b, h) (48 heads -> 192 programs at B = 1).
BV = 32
NUM_WARPS = 4


@triton.jit(do_not_specialize=["T", "keep_states", "use_table", "stride_v", "stride_a", "stride_b"])
def _recurrent_gdn_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    g_ptr,
    beta_ptr,
    a_ptr,
    b_ptr,
    alog_ptr,
    dtb_ptr,
    s0_ptr,
    o_ptr,
    states_ptr,
    tab_ptr,
    T,
    H,
    stride_v,
    stride_a,
    stride_b,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    keep_states,
    use_table,
    HAS_STATE: tl.constexpr,
    GATES: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    enter(PDL)  # kernels/pdl.py: after the kernel before, memory visible
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1)
    i_b = i_bh // H
    i_h = i_bh % H

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_k = o_k < DK
    m_v = o_v < DV
    m_kv = m_k[:, None] & m_v[None, :]
    tile = o_k[:, None] * DV + o_v[None, :]  # offsets inside one [DK, DV] state

    # batch b's state is session b's (session_tables.gdn_table), read and written in place;
    # a runtime flag, so one compiled kernel (one layout of the state tile) serves both uses
    base_s0 = i_bh.to(tl.int64) * DK * DV
    if use_table != 0:
        base_s0 = tl.multiple_of(tl.load(tab_ptr + i_b * TABLE_WIDTH), 16) + i_h * DK * DV
    if HAS_STATE:
        s = tl.load(s0_ptr + base_s0 + tile, mask=m_kv, other=0.0).to(tl.float32)
    else:
        s = tl.zeros([BK, BV], dtype=tl.float32)
    if GATES:  # this head's gate weights, for every row
        a_log = tl.load(alog_ptr + i_h).to(tl.float32)
        dt_bias = tl.load(dtb_ptr + i_h).to(tl.float32)

    for r in range(0, T):
        row = (i_b.to(tl.int64) * T + r) * H + i_h  # index of (b, r, h) in [B, T, H]
        b_q = tl.load(q_ptr + row * DK + o_k, mask=m_k, other=0.0).to(tl.float32)
        b_k = tl.load(k_ptr + row * DK + o_k, mask=m_k, other=0.0).to(tl.float32)
        # v's rows (b, r) stride_v apart, heads DV apart: a column slice of the conv output
        v_row = (i_b.to(tl.int64) * T + r) * stride_v + i_h * DV
        b_v = tl.load(v_ptr + v_row + o_v, mask=m_v, other=0.0).to(tl.float32)
        if GATES:  # gdn_gates' arithmetic on row (b, r)'s a and b, rows stride_a/b apart
            ab_row = i_b.to(tl.int64) * T + r
            raw_a = tl.load(a_ptr + ab_row * stride_a + i_h).to(tl.float32)
            raw_b = tl.load(b_ptr + ab_row * stride_b + i_h).to(tl.float32)
            b_g, b_beta = gdn_gate_values(raw_a, raw_b, a_log, dt_bias, b_ptr.dtype.element_ty)
            b_beta = b_beta.to(tl.float32)
        else:
            b_g = tl.load(g_ptr + row).to(tl.float32)
            b_beta = tl.load(beta_ptr + row).to(tl.float32)

        s = s * tl.exp(b_g)
        mem = tl.sum(s * b_k[:, None], axis=0)  # S^T k: [BV]
        u = (b_v - mem) * b_beta
        s = s + b_k[:, None] * u[None, :]
        out = tl.sum(s * b_q[:, None], axis=0)  # S^T q: [BV]
        tl.store(o_ptr + row * DV + o_v, out.to(o_ptr.dtype.element_ty), mask=m_v)
        if keep_states != 0:
            tl.store(states_ptr + row * DK * DV + tile, s, mask=m_kv)

    if use_table != 0:
        tl.store(s0_ptr + base_s0 + tile, s, mask=m_kv)
    elif keep_states == 0:
        tl.store(states_ptr + i_bh.to(tl.int64) * DK * DV + tile, s, mask=m_kv)


def _rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(x, stride): x [B, T, ...] read where it lies when its (b, t) rows are evenly strided
    (v: the conv output's column slice of a batch of sessions; a, b: the input projection's),
    else its rows copied (`rows_view`); stride is the rows'."""
    rows = rows_view(x, math.prod(x.shape[2:]))
    return (x if rows.data_ptr() == x.data_ptr() else rows), rows.stride(0)


def _gate_args(g, beta, gates) -> dict:
    """The kernel's gate arguments: g and beta [B, T, H] (contiguous), or with
    gates=(a, b, A_log, dt_bias) (a, b [B, T, H]) those, GATES=1, and g, beta unused."""
    if gates is None:
        g, beta = g.contiguous(), beta.contiguous()
        return dict(
            g_ptr=g,
            beta_ptr=beta,
            a_ptr=g,
            b_ptr=beta,
            alog_ptr=g,
            dtb_ptr=g,
            stride_a=0,
            stride_b=0,
        )
    a, b, a_log, dt_bias = gates
    (a, stride_a), (b, stride_b) = _rows(a), _rows(b)
    return dict(
        g_ptr=a,
        beta_ptr=b,
        a_ptr=a,
        b_ptr=b,
        alog_ptr=a_log.contiguous(),
        dtb_ptr=dt_bias.contiguous(),
        stride_a=stride_a,
        stride_b=stride_b,
        GATES=1,
    )


def recurrent_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    keep_states: bool = True,
    out: torch.Tensor | None = None,
    gates: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token gated delta rule that returns the state after every row (fp32 math).

    q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g (log decay), beta: [B, T, H];
    state: [B, H, Dk, Dv] or None (zeros). Returns (o [B, T, H, Dv] in v's dtype,
    states [B, T, H, Dk, Dv] fp32, the state after each row; [B, 1, H, Dk, Dv] with
    keep_states=False). out: a contiguous fp32 tensor of the states' shape to write them in;
    with one row (or keep_states=False) it may be `state` itself, viewed [B, 1, H, Dk, Dv]:
    each program reads its state tile before it writes it (the lone step's state in place).
    gates: (a, b [B, T, H], A_log, dt_bias [H]) in place of g and beta (None): the kernel
    computes them as gdn_gates does.
    """
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    q, k = q.contiguous(), k.contiguous()
    v, stride_v = _rows(v)
    o = torch.empty(b, t, h, dv, dtype=v.dtype, device=v.device)
    shape = (b, t if keep_states else 1, h, dk, dv)
    if out is None:
        states = torch.empty(shape, dtype=torch.float32, device=v.device)
    elif tuple(out.shape) != shape or out.dtype != torch.float32 or not out.is_contiguous():
        raise ValueError(
            f"recurrent_gdn: out must be contiguous fp32 {shape}, got "
            f"{out.dtype} {tuple(out.shape)}"
        )
    else:
        states = out
    if t == 0:  # nothing to run: the last state is the initial one
        if not keep_states:
            states.copy_(state.unsqueeze(1) if state is not None else states.zero_())
        return o, states
    s0 = state.to(torch.float32).contiguous() if state is not None else o  # dummy when absent
    grid = (triton.cdiv(dv, BV), b * h)
    _recurrent_gdn_kernel[grid](
        q_ptr=q,
        k_ptr=k,
        v_ptr=v,
        s0_ptr=s0,
        o_ptr=o,
        states_ptr=states,
        tab_ptr=no_table(v.device),
        T=t,
        H=h,
        stride_v=stride_v,
        **_gate_args(g, beta, gates),
        keep_states=int(keep_states),
        use_table=0,
        DK=dk,
        DV=dv,
        BK=triton.next_power_of_2(dk),
        BV=BV,
        HAS_STATE=state is not None,
        num_warps=NUM_WARPS,
        **pdl(o.device),
    )
    return o, states


def gdn_sessions(
    q,
    k,
    v,
    g,
    beta,
    states: list[torch.Tensor],
    table: torch.Tensor | None = None,
    gates: tuple | None = None,
    after: torch.Tensor | None = None,
) -> torch.Tensor:
    """reference.gdn_sessions in one launch: batch b's rows run from session b's state, which
    the kernel reads and writes in place through `table` (session_tables.gdn_table of the sessions,
    made here when not given; a CUDA graph needs it made before its capture): no stacked
    copy and no copy back. The same arithmetic per (b, h) tile as recurrent_gdn, so the bits
    of a session alone. gates: as recurrent_gdn's. after: contiguous fp32 [B, T, H, Dk, Dv]
    for the state after every row (keep_states, a runtime flag: the same compiled kernel)."""
    if table is None:
        table = offsets_table([states])
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    first = states[0]
    if first.dtype != torch.float32 or tuple(first.shape) != (h, dk, dv):
        raise ValueError(f"gdn_sessions: states of {first.dtype} {tuple(first.shape)}")
    keep, shape = after is not None, (b, t, h, dk, dv)
    if keep and not (after.dtype == torch.float32 and after.is_contiguous()):
        raise ValueError(f"gdn_sessions: after must be contiguous fp32 {shape}")
    if keep and after.shape != shape:
        raise ValueError(f"gdn_sessions: after must be contiguous fp32 {shape}")
    q, k = q.contiguous(), k.contiguous()
    v, stride_v = _rows(v)
    o = torch.empty(b, t, h, dv, dtype=v.dtype, device=v.device)
    if t == 0:
        return o
    _recurrent_gdn_kernel[(triton.cdiv(dv, BV), b * h)](
        q_ptr=q,
        k_ptr=k,
        v_ptr=v,
        s0_ptr=first,
        o_ptr=o,
        states_ptr=after if keep else first,
        tab_ptr=table,
        T=t,
        H=h,
        stride_v=stride_v,
        **_gate_args(g, beta, gates),
        keep_states=int(keep),
        use_table=1,
        DK=dk,
        DV=dv,
        BK=triton.next_power_of_2(dk),
        BV=BV,
        HAS_STATE=True,
        num_warps=NUM_WARPS,
        **pdl(o.device),
    )
    return o
