"""Gated DeltaNet: the chunked form (prefill, training) and the recurrent form (verify rows).

Both take q and k already L2-normalised, q already scaled by 1/sqrt(Dk), and value heads
already matched (q, k repeated so that value head j reads key head j // (HV / HK)).
The state S [Dk, Dv] per head evolves per token t as
    S = exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S = S + k_t u_t^T;  o_t = S^T q_t.
"""

from __future__ import annotations

import torch

from flashlane.kernels.rowwise.reference import gdn_gates

CHUNK = 64


def chunk_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    chunk: int = CHUNK,
    lengths: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated delta rule, differentiable.

    q, k: [B, T, H, Dk]; v: [B, T, H, Dv]; g (log decay, <= 0), beta: [B, T, H];
    state: [B, H, Dk, Dv] or None (zeros). Chunks start at index 0 of the call, so a caller
    whose pieces start at multiples of `chunk` gets chunks at absolute multiples of it.
    lengths: B = 1 and the T rows are these sequences back to back, state [len(lengths), ...]
    (the GPU's varlen call; here each runs alone, so its bits are those of a call of its own).
    Returns (o [B, T, H, Dv] in v's dtype, final state [B, H, Dk, Dv] in at least fp32).
    """
    if lengths is not None:
        return _each(q, k, v, g, beta, state, chunk, lengths)
    b, t, h, dk = k.shape
    dv, out_dtype = v.shape[-1], v.dtype
    dt = torch.promote_types(v.dtype, torch.float32)
    q, k, v, g, beta = (x.transpose(1, 2).to(dt) for x in (q, k, v, g, beta))
    pad = (-t) % chunk
    if pad:
        q, k, v = (torch.nn.functional.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (torch.nn.functional.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk
    q, k, v = (x.reshape(b, h, n, chunk, -1) for x in (q, k, v))
    g, beta = g.reshape(b, h, n, chunk), beta.reshape(b, h, n, chunk)
    gam = g.cumsum(-1)
    # decay[i, j] = exp(gam_i - gam_j) for j <= i, else 0
    diff = gam.unsqueeze(-1) - gam.unsqueeze(-2)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()
    kk = k @ k.transpose(-1, -2)
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    a = torch.where(strict, kk * decay * beta.unsqueeze(-1), torch.zeros_like(kk))
    eye = torch.eye(chunk, dtype=dt, device=q.device)
    # (I + A) u = beta v - beta exp(gam) k^T S0, solved once for both right-hand sides
    rhs = torch.cat([v * beta.unsqueeze(-1), k * (beta * gam.exp()).unsqueeze(-1)], dim=-1)
    sol = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    u_v, u_k = sol[..., :dv], sol[..., dv:]
    qk = (q @ k.transpose(-1, -2)) * decay
    q_dec = q * gam.exp().unsqueeze(-1)
    k_tail = k * (gam[..., -1:] - gam).exp().unsqueeze(-1)
    s = state.to(dt) if state is not None else q.new_zeros(b, h, dk, dv)
    outs = []
    for i in range(n):
        u = u_v[:, :, i] - u_k[:, :, i] @ s
        outs.append(q_dec[:, :, i] @ s + qk[:, :, i] @ u)
        s = s * gam[:, :, i, -1:].exp().unsqueeze(-1) + k_tail[:, :, i].transpose(-1, -2) @ u
    o = torch.stack(outs, dim=2).reshape(b, h, n * chunk, dv)[:, :, :t]
    return o.transpose(1, 2).to(out_dtype), s


def _each(q, k, v, g, beta, state, chunk: int, lengths: list[int]):
    """chunk_gdn over [1, sum(lengths)] rows holding len(lengths) sequences, one at a time."""
    if q.shape[0] != 1 or sum(lengths) != q.shape[1]:
        raise ValueError(f"chunk_gdn: lengths {lengths} do not tile {tuple(q.shape[:2])} rows")
    outs, finals, at = [], [], 0
    for i, n in enumerate(lengths):
        part = (x[:, at : at + n] for x in (q, k, v, g, beta))
        o, s = chunk_gdn(*part, state[i : i + 1] if state is not None else None, chunk)
        outs.append(o)
        finals.append(s)
        at += n
    return torch.cat(outs, dim=1), torch.cat(finals)


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
    """Token-by-token gated delta rule that returns the state after every row.

    Shapes as chunk_gdn. Returns (o [B, T, H, Dv], states [B, T, H, Dk, Dv]) where states[:, r]
    is the state after row r, so keeping r + 1 rows of a verify window is an index
    (with keep_states=False, states is [B, 1, H, Dk, Dv]: only the last). out: a tensor of
    the states' shape to write them in (it may be `state` itself, viewed [B, 1, ...]).
    gates: (a, b [B, T, H], A_log, dt_bias [H]) in place of g and beta, which gdn_gates
    makes of them (the Triton kernel computes them in its programs).
    """
    if gates is not None:
        g, beta = gdn_gates(*gates)
    b, t, h, dk = k.shape
    dt = torch.promote_types(v.dtype, torch.float32)
    s = state.to(dt) if state is not None else q.new_zeros(b, h, dk, v.shape[-1], dtype=dt)
    outs, states = [], []
    for r in range(t):
        q_r, k_r, v_r = q[:, r].to(dt), k[:, r].to(dt), v[:, r].to(dt)
        s = s * g[:, r].to(dt).exp()[..., None, None]
        mem = (s * k_r.unsqueeze(-1)).sum(-2)
        u = (v_r - mem) * beta[:, r].to(dt).unsqueeze(-1)
        s = s + k_r.unsqueeze(-1) * u.unsqueeze(-2)
        outs.append((s * q_r.unsqueeze(-1)).sum(-2))
        if keep_states:
            states.append(s)
    kept = torch.stack(states, dim=1) if keep_states else s.unsqueeze(1)
    if out is not None:
        if out.shape != kept.shape:
            raise ValueError(
                f"recurrent_gdn: out must be {tuple(kept.shape)}, got {tuple(out.shape)}"
            )
        kept = out.copy_(kept)
    return torch.stack(outs, dim=1).to(v.dtype), kept


def gdn_sessions(
    q,
    k,
    v,
    g,
    beta,
    states: list[torch.Tensor],
    table=None,
    gates: tuple | None = None,
    after: torch.Tensor | None = None,
) -> torch.Tensor:
    """B sessions' rows (a lone step of several sessions), batch b from session b's
    recurrent state states[b] [H, Dk, Dv], which ends holding the state after b's last row
    -> o [B, T, H, Dv]. Here the states are stacked, run together and copied back (a row's
    bits do not depend on its batch); `table` is for the in-place kernel and unused here.
    gates: as recurrent_gdn's. after: [B, T, H, Dk, Dv] gets the state after every row (a
    drafted step's window, whose commit puts back the kept row's)."""
    keep = after is not None
    o, s = recurrent_gdn(q, k, v, g, beta, torch.stack(states), keep_states=keep, gates=gates)
    if keep:
        after.copy_(s)
    torch._foreach_copy_(states, list(s[:, -1]))
    return o
