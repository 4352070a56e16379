"""Row-wise tails of the layers, as torch ops: the hyper-connections' squash, mix and write,
the GDN gates and q/k, RoPE (alone, and after the attention heads' norms), the PLE's n-gram
rows and gate, the shared expert's SwiGLU and gated add.

Each is the model's arithmetic written once, with torch's rounding to the inputs' dtype after
every op; `triton.py` fuses each into one launch with the same roundings (the gated add is
the MoE combine's, kernels/moe/triton.py). Every output row depends on its own input row
alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from flashlane.kernels.linear.reference import linear
from flashlane.kernels.norms.reference import l2norm, rms_norm


def hc_squash(d: torch.Tensor, hc: int) -> torch.Tensor:
    """The low-rank mix activation silu(d / hc)."""
    return F.silu(d / hc)


def hc_down(xn: torch.Tensor, w: torch.Tensor, lowrank: int, hc: int) -> torch.Tensor:
    """The down projection w [L + extra, hc*H] of the normed streams xn, its first L columns
    squashed (hc_squash) for the up projection to read: [N, L + extra]."""
    y = linear(xn, w)
    return torch.cat([hc_squash(y[..., :lowrank], hc), y[..., lowrank:]], dim=-1)


def hc_mix(
    u: torch.Tensor, xn: torch.Tensor, inject: torch.Tensor | None, hc: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A block's read of the hc streams: u, xn [N, hc*H] (the mix logits, the normed streams),
    inject [N, hc] or None -> (a = mean_c(sigmoid(u_c) * xn_c) [N, H],
    w = 2 sigmoid(inject / hc) [N, hc] or None)."""
    mix = torch.sigmoid(u)
    a = mean_of_streams((mix * xn).unflatten(-1, (hc, -1)))
    return a, (None if inject is None else 2 * torch.sigmoid(inject / hc))


def hc_up_mix(
    squashed: torch.Tensor,
    up: torch.Tensor,
    xn: torch.Tensor,
    inject: torch.Tensor | None,
    hc: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The up projection up [hc*H, L] of the squashed low-rank columns, then hc_mix."""
    return hc_mix(linear(squashed, up), xn, inject, hc)


def mean_of_streams(x: torch.Tensor) -> torch.Tensor:
    """[N, hc, H] -> [N, H]: the streams added in order, then divided. Elementwise adds, so a
    row's result does not depend on the row count (a reduction kernel may change its order)."""
    total = x[:, 0]
    for c in range(1, x.shape[1]):
        total = total + x[:, c]
    return total / x.shape[1]


def hc_write(r: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """R + y (x) w: y [N, H] added to each stream c of r [N, hc*H] with weight w[:, c]."""
    return r + (y.unsqueeze(-2) * w.unsqueeze(-1)).flatten(-2)


def hc_write_norm(
    r: torch.Tensor,
    y: torch.Tensor,
    w: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """hc_write, then the next read's grouped RMSNorm of the result (`weight` [hc*H], groups
    of H = y's width): (R + y (x) w, its norm); rows [B]: the norm of those rows of the
    result alone [B, hc*H], each pick in its own run of N / B rows."""
    out = hc_write(r, y, w)
    return out, rms_norm(out, weight, eps, y.shape[-1], rows=rows)


def gdn_gates(
    a: torch.Tensor, b: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The GDN's per-head gates from its projections a, b [N, HV]: (log decay
    g = -exp(A_log) softplus(a + dt_bias) in at least fp32, beta = sigmoid(b) in b's dtype)."""
    dt = torch.promote_types(a.dtype, torch.float32)
    g = -a_log.to(dt).exp() * F.softplus(a.to(dt) + dt_bias.to(dt))
    return g, torch.sigmoid(b)


def gdn_qk(
    y: torch.Tensor, heads: int, dim: int, rep: int, scale: float, with_v: bool = False
) -> tuple[torch.Tensor, ...]:
    """The GDN's queries and keys from its conv output y [..., C] (q, then k, then v; `heads`
    heads of `dim` each): each head L2-normed, q times `scale`, every head repeated `rep`
    times to match the value heads -> q, k [..., heads * rep, dim]; with_v, also the
    heads * rep value heads of `dim` as a contiguous copy (what a chunked rule reads)."""
    kd = heads * dim
    q = y[..., :kd].unflatten(-1, (heads, dim))
    k = y[..., kd : 2 * kd].unflatten(-1, (heads, dim))
    q = (l2norm(q) * scale).repeat_interleave(rep, dim=-2)
    k = l2norm(k).repeat_interleave(rep, dim=-2)
    if not with_v:
        return q, k
    v = y[..., 2 * kd : 2 * kd + heads * rep * dim].unflatten(-1, (heads * rep, dim))
    return q, k, v.contiguous()


def cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype, block: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's cos and sin [N, R] for positions [N] (each first rounded down to a multiple of
    `block`): angles position * inv_freq in fp32 (the fp32 rounding of the product is part of
    the model's numerics), both halves alike, then cast to dtype."""
    if block != 1:
        positions = torch.div(positions, block, rounding_mode="floor") * block
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the leading R dims of each head: x [N, heads, D]; cos, sin [N, R]
    with R <= D even, in x's dtype."""
    r = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    xr, rest = x[..., :r], x[..., r:]
    half = r // 2
    rotated = torch.cat([-xr[..., half:], xr[..., :half]], dim=-1)
    return torch.cat([xr * cos + rotated * sin, rest], dim=-1)


def norm_rope_heads(
    parts: list[tuple[torch.Tensor, torch.Tensor, float]], cos: torch.Tensor, sin: torch.Tensor
) -> list[torch.Tensor]:
    """The attention's heads made ready: each part (x [N, heads, D], weight [D], eps) through
    the zero-centred rms_norm over each head's D values, then rope (cos, sin [N, R]) -> the
    parts' [N, heads, D] (the queries, keys and indexer queries of a QSA layer)."""
    return [rope(rms_norm(x, w, eps), cos, sin) for x, w, eps in parts]


def ngram_ids(
    history: torch.Tensor,
    multipliers: torch.Tensor,
    sizes: torch.Tensor,
    offsets: torch.Tensor,
    n: int,
    heads: int,
    eos: int,
) -> torch.Tensor:
    """The PLE's n-gram table rows: history [B, n-1+T] ids (the n-1 before the rows first)
    -> [B, T, (n-1) * heads]. The k-th previous id of a row reads `eos` once an earlier one
    (nearer the row) is `eos`; order o hashes x_t*m_0 ^ x_(t-1)*m_1 ^ ... (int64, wrapping)
    into each of its heads' tables: remainder by the head's size plus its offset."""
    ctx = n - 1
    t = history.shape[1] - ctx
    shifted, broken = [history[:, ctx:]], torch.zeros_like(history[:, ctx:], dtype=torch.bool)
    for s in range(1, n):
        prev = history[:, ctx - s : ctx - s + t]
        shifted.append(torch.where(broken, torch.full_like(prev, eos), prev))
        broken = broken | (prev == eos)
    ids, mixed = [], shifted[0] * multipliers[0]
    for order in range(2, n + 1):
        mixed = torch.bitwise_xor(mixed, shifted[order - 1] * multipliers[order - 1])
        head = slice((order - 2) * heads, (order - 1) * heads)
        ids.append(torch.remainder(mixed.unsqueeze(-1), sizes[head]) + offsets[head])
    return torch.cat(ids, dim=-1)


def ngram_embed(
    history: torch.Tensor,
    multipliers: torch.Tensor,
    sizes: torch.Tensor,
    offsets: torch.Tensor,
    n: int,
    heads: int,
    eos: int,
    table: torch.Tensor,
    scale: torch.Tensor | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """ngram_ids' rows of `table` [R, D], each row's side by side: [B, T, (n-1) * heads * D].
    An 8-bit table (models/table8.py): table int8 [R, D] with scale [R] fp32, its rows read
    back as q.float() * scale rounded to `dtype` (the output's dtype)."""
    ids = ngram_ids(history, multipliers, sizes, offsets, n, heads, eos)
    rows = F.embedding(ids, table)
    if scale is not None:
        # table8.dequantize_rows' arithmetic (kernels import no model code)
        rows = (rows.float() * scale[ids].unsqueeze(-1)).to(dtype)
    return rows.flatten(-2)


def ple_gate(
    key: torch.Tensor,
    r: torch.Tensor,
    value: torch.Tensor,
    w_key: torch.Tensor,
    w_query: torch.Tensor,
    w_conv: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The PLE's gate: stream c of r [N, hc*H] takes value [N, H] times
    sigmoid(signed sqrt(<norm_key(key)_c, norm_query(r)_c> / sqrt(H))), key [N, hc*H] the
    embedding's key projection; returns (that [N, hc*H], its conv norm): grouped RMSNorms of
    H values with the weights w_key, w_query and w_conv [hc*H]."""
    n, h = value.shape
    k = rms_norm(key, w_key, eps, h).reshape(n, -1, h)
    q = rms_norm(r, w_query, eps, h).reshape(n, -1, h)
    gate = (k * q).sum(-1, keepdim=True) / math.sqrt(h)
    gate = gate.abs().clamp_min(1e-6).sqrt() * gate.sign()
    gated = (torch.sigmoid(gate) * value.unsqueeze(-2)).flatten(-2)
    return gated, rms_norm(gated, w_conv, eps, h)


def gated_heads(o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The attention's output gate: o, gate [N, Hq, D] -> o * sigmoid(gate) as [N, Hq * D]."""
    n = o.shape[0]
    return o.reshape(n, -1) * torch.sigmoid(gate.reshape(n, -1))


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up."""
    return F.silu(gate) * up


def greedy_step(
    logits: torch.Tensor, out: torch.Tensor, tok: torch.Tensor, pos: torch.Tensor
) -> None:
    """A greedy step's tail, in place: logits [B, V] -> out[:, 0] each row's first maximum
    (ties: the lower id), out[:, 1] 1 if it is finite (0 for a NaN row), tok the ids, pos + 1."""
    top, ids = logits.float().max(dim=1)
    out[:, 0] = ids
    out[:, 1] = torch.isfinite(top)
    tok.copy_(ids)
    pos.add_(1)


def draft_pick(logits: torch.Tensor, drafts: torch.Tensor, d: int) -> None:
    """A drafted step's MTP draft d, in place: drafts[:, d] ([B, K]) = argmax of logits [B, V]."""
    drafts[:, d] = logits.argmax(dim=1)


def accept_window(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    firsts: torch.Tensor,
    out: torch.Tensor,
    tok: torch.Tensor,
    pos: torch.Tensor,
    marks: torch.Tensor,
    ids: torch.Tensor,
) -> None:
    """A drafted step's verdict, in place (runner/draft_step.py): logits [B*T, V] the window
    rows' (session b's rows b*T .. b*T + T-1), drafts [B, K] (K = T-1), firsts [B] each
    session's first row among the B*T. Each row's draw is its first maximum (ties: the lower
    id), into ids [B*T]; a row is finite where that maximum is (not NaN, not infinite); the
    kept rows are 1 + the leading drafts that equal the draw before them on a finite row.
    Writes out [B, 2T+1] (the draws, their finite flags, the kept count), tok [B] the last
    kept row's draw, marks [3, B] (kept, kept - 1, firsts + kept - 1), and moves pos on by
    kept."""
    b, t = drafts.shape[0], drafts.shape[1] + 1
    top, got = logits.max(dim=1)
    ids.copy_(got)
    top, got = top.view(b, t), got.view(b, t)
    finite = top.abs() < float("inf")
    lands = (drafts == got[:, : t - 1]) & finite[:, : t - 1]
    kept = 1 + lands.long().cumprod(dim=1).sum(dim=1)
    out[:, :t] = got
    out[:, t : 2 * t] = finite
    out[:, 2 * t] = kept
    tok.copy_(got.gather(1, (kept - 1)[:, None])[:, 0])
    marks[0], marks[1], marks[2] = kept, kept - 1, firsts + kept - 1
    pos.add_(kept)


def embed_rows(weight: torch.Tensor, tok: torch.Tensor, copies: int, norm=None):
    """A lone step's first residual streams: each token's embedding row, `copies` times
    side by side, [B, copies * H]; with norm = (weight [copies * H], eps), also their grouped
    RMSNorm by H (the first read's norm): (rows, normed)."""
    r = F.embedding(tok, weight).repeat(1, copies)
    return r if norm is None else (r, rms_norm(r, norm[0], norm[1], weight.shape[1]))


def ple_add(r: torch.Tensor, gated: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """A lone step's PLE addition to its streams: r + (gated + y)."""
    return r + (gated + y)


def push_history(ids: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """A lone step's n-gram ids: history = [ids, tok] per row [B, ctx + 1], and ids (its
    sessions' own, [B, ctx]) moved on to history[:, 1:] in place."""
    history = torch.cat([ids, tok[:, None]], dim=1)
    ids.copy_(history[:, 1:])
    return history


def gated_add(base: torch.Tensor, gate: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """base + sigmoid(gate) * s: gate [N, 1] scales each row of s [N, H]."""
    return base + torch.sigmoid(gate) * s


def gather_sessions(
    tensors: list[torch.Tensor],
    table: torch.Tensor | None = None,
    column: int = 0,
    tail: torch.Tensor | None = None,
) -> torch.Tensor:
    """B sessions' buffers of one kind (the same shape each), stacked: [B, *shape]. `table`
    (session_tables', from tensors[0]) lets the Triton kernel read them where they lie.
    tail [B, m, ...]: appended along dim 1 ([B, shape[0] + m, ...])."""
    out = torch.stack(tensors)
    return out if tail is None else torch.cat([out, tail.to(out.dtype)], dim=1)


def put_sessions(tensors: list[torch.Tensor], values: torch.Tensor, table=None, column=0) -> None:
    """gather_sessions' inverse: session b's buffer gets values[b], in place (`table`, the
    column of the sessions' in it: as gather_sessions')."""
    torch._foreach_copy_(tensors, list(values))


def put_sessions_from(
    tensors: list[torch.Tensor],
    src: torch.Tensor,
    start: torch.Tensor,
    rows: int,
    table: torch.Tensor | None = None,
    column: int = 0,
    also: tuple | None = None,
) -> None:
    """put_sessions of a slice of each batch's rows: session b's buffer gets src[b, start[b] :
    start[b] + rows] (src [B, L, ...] contiguous, start [B] on its device; the buffer holds
    those rows' elements), in place (a drafted step's kept tails and states). also: a second
    (tensors, src, start, rows, column) through the same table (one launch in Triton)."""
    span = start[:, None] + torch.arange(rows, device=start.device)
    index = span.view(*span.shape, *[1] * (src.dim() - 2)).expand(-1, -1, *src.shape[2:])
    chosen = src.gather(1, index)
    put_sessions(tensors, chosen.reshape(len(tensors), *tensors[0].shape), table, column)
    if also is not None:
        put_sessions_from(*also[:4], table, also[4])
