"""QSA sparse attention: the block indexer (top blocks, lower-id ties) and masked attention.

A query at position p sees complete blocks of `block` keys (blocks aligned to position 0,
complete when their last position is <= p) and the incomplete tail (0..block-1 tokens). While
it has at most `top_blocks` complete blocks it sees them all (dense causal attention);
past that, the indexer keeps the top `top_blocks` by score, ties toward the lower block id.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from flashlane.kernels.attention import kv8
from flashlane.kernels.norms.reference import rms_norm
from flashlane.kernels.rowwise.reference import rope


def pool_blocks(raw_keys: torch.Tensor, block: int) -> torch.Tensor:
    """Mean of each complete block of raw indexer keys, in at least fp32, in the keys' dtype.

    raw_keys: [B, L, Di] -> [B, L // block, Di] (norm and RoPE are the caller's).
    """
    b, n, d = raw_keys.shape
    nb = n // block
    dt = torch.promote_types(raw_keys.dtype, torch.float32)
    parts = raw_keys[:, : nb * block].to(dt).reshape(b, nb, block, d)
    # positions added in order (elementwise): the same bits however many blocks one call pools
    total = parts[:, :, 0]
    for j in range(1, block):
        total = total + parts[:, :, j]
    return (total / block).to(raw_keys.dtype)


def block_keys(
    raw_keys: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    block: int,
) -> torch.Tensor:
    """The indexer's block keys: raw keys [B, nb*block, Di] pooled per block, RMS-normed
    (`weight`, zero-centred) and roped with cos, sin [nb, R] of the blocks' first positions
    -> [B, nb, Di]."""
    pooled = rms_norm(pool_blocks(raw_keys, block), weight, eps)
    return rope(pooled.transpose(0, 1), cos, sin).transpose(0, 1)


def pool_block_at(
    index_keys: torch.Tensor,
    out: torch.Tensor,
    pos: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    block: int,
) -> None:
    """out[b] = the block key of block b = pos // block, from index_keys [L, Di] (its keys so
    far), when b < len(out); cos, sin [1, R] of the position b * block. pos: [1] on the
    device (a lone step: no host value)."""
    nb = out.shape[0]
    b = torch.div(pos, block, rounding_mode="floor")
    at = b.clamp(max=nb - 1)
    keys = index_keys.index_select(0, at * block + torch.arange(block, device=pos.device))
    fresh = block_keys(keys[None], cos, sin, weight, eps, block)[0]
    old = out.index_select(0, at)
    out.index_copy_(0, at, torch.where((b < nb).view(1, 1), fresh, old))


def index_scores(index_q: torch.Tensor, block_keys: torch.Tensor) -> torch.Tensor:
    """sum_h relu(index_q[b, t, h] . block_keys[b, n]) / sqrt(Di), in at least fp32: [B, T, NB]."""
    b, t, hi, di = index_q.shape
    nb = block_keys.shape[1]
    dt = torch.promote_types(index_q.dtype, torch.float32)
    scores = index_q.to(dt).reshape(b, t * hi, di) @ block_keys.to(dt).transpose(1, 2)
    return scores.reshape(b, t, hi, nb).relu().sum(2) / di**0.5


def select_mask(
    index_q: torch.Tensor,
    block_keys: torch.Tensor,
    positions: torch.Tensor,
    num_keys: int,
    block: int,
    top_blocks: int,
    scores_of=index_scores,
    dense_check: bool = True,
    decode: bool = False,
) -> torch.Tensor:
    """Which keys each query may attend to.

    index_q: [B, T, Hi, Di] (normed, roped); block_keys: [B, NB, Di] (pooled, normed, roped);
    positions: [B, T] absolute query positions; keys are positions 0..num_keys-1.
    `scores_of(index_q, block_keys)` computes the indexer scores (the Triton set passes its own).
    `decode` (the rows are decode rows, whose Triton scores take their own tile) changes
    nothing here: one arithmetic for every row.
    Returns a bool mask [B, T, num_keys].

    `dense_check=False` skips the shortcut for rows that see all their complete blocks, which
    reads a device value on the host (a CUDA graph cannot): the ranking then keeps every valid
    block of such rows anyway (valid scores are finite, so they rank above the invalid ones'
    -inf), and the mask is the same. Block keys past a row's complete blocks may then hold
    anything: they are never valid.
    """
    nb = block_keys.shape[1]
    complete = torch.div(positions + 1, block, rounding_mode="floor")  # [B, T]
    key_pos = torch.arange(num_keys, device=positions.device)
    causal = key_pos.view(1, 1, -1) <= positions.unsqueeze(-1)
    if nb == 0 or (dense_check and int(complete.max()) <= top_blocks):
        return causal
    scores = scores_of(index_q, block_keys)  # [B, T, NB]
    block_ids = torch.arange(nb, device=positions.device).view(1, 1, -1)
    valid = block_ids < complete.unsqueeze(-1)
    scores = torch.where(valid, scores, torch.full_like(scores, float("-inf")))
    # A stable descending sort ranks equal scores by block id: ties go to the lower id.
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, block_ids.expand_as(order).contiguous())
    keep_block = valid & (rank < top_blocks)
    key_block = torch.div(key_pos, block, rounding_mode="floor").clamp(max=nb - 1)
    in_complete = key_pos.view(1, 1, -1) < (complete * block).unsqueeze(-1)
    chosen = torch.gather(keep_block, 2, key_block.view(1, 1, -1).expand(*keep_block.shape[:2], -1))
    return causal & torch.where(in_complete, chosen, torch.ones_like(chosen))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    scale: float,
    lengths: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    split: bool = False,
) -> torch.Tensor:
    """Masked softmax attention with grouped KV heads (`split`: the Triton walk's ranges for
    decode windows; one sum here).

    q: [B, T, Hq, D]; k, v: [B, L, Hkv, D]; mask: [B, T, L] bool -> [B, T, Hq, D].
    Scores and softmax in at least fp32. `lengths` ([B]): keys at or past lengths[b] are
    not read, as if the caches ended there (they may hold anything, NaN included).
    `positions` ([B, T]): each row's position, past which its mask allows nothing; a kernel
    may stop its walk there (this one reads the mask alone).
    """
    if lengths is not None:
        n = int(lengths.max())
        k, v, mask = k[:, :n], v[:, :n], mask[..., :n]
        if n and int(lengths.min()) < n:  # a shorter sequence's keys past its end read as 0
            seen = torch.arange(n, device=k.device) < lengths.view(-1, 1)
            k = torch.where(seen[:, :, None, None], k, torch.zeros_like(k))
            v = torch.where(seen[:, :, None, None], v, torch.zeros_like(v))
    b, t, hq, d = q.shape
    hkv = k.shape[2]
    dt = torch.promote_types(q.dtype, torch.float32)
    rep = hq // hkv
    # query heads grouped under their kv head: [B, Hkv, rep*T, D], no copy of the cache
    qg = q.to(dt).reshape(b, t, hkv, rep, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, rep * t, d)
    kt = k.to(dt).permute(0, 2, 3, 1)  # [B, Hkv, D, L]
    scores = (qg @ kt) * scale
    allowed = mask.unsqueeze(1).unsqueeze(2).expand(b, 1, rep, t, -1).reshape(b, 1, rep * t, -1)
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores, dim=-1) @ v.to(dt).transpose(1, 2)  # [B, Hkv, rep*T, D]
    return out.reshape(b, hkv, rep, t, d).permute(0, 3, 1, 2, 4).reshape(b, t, hq, d).to(q.dtype)


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    positions: torch.Tensor,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal softmax attention with grouped KV heads (the siblings' gated full attention):
    row (b, t) sees keys 0 .. positions[b, t] of batch b, no mask tensor given.

    q: [B, T, Hq, D]; k, v: [B, L, Hkv, D]; positions: [B, T] -> [B, T, Hq, D]. `lengths`
    as attention's. The spec: attention() with the causal mask of the positions.
    """
    keys = torch.arange(k.shape[1], device=positions.device)
    mask = keys.view(1, 1, -1) <= positions.unsqueeze(-1)
    return attention(q, k, v, mask, scale, lengths=lengths, positions=positions)


def attend_sessions(
    q,
    k,
    v,
    iq,
    raw,
    caches,
    pos,
    cos,
    sin,
    weight,
    eps: float,
    block: int,
    top_blocks: int,
    scale: float,
    table=None,
    ops=None,
    lengths=None,
) -> torch.Tensor:
    """One row for each of B sessions (a lone step): session i's k[i], v[i] and raw indexer
    key raw[i] written at pos[i], the block holding pos[i] pooled again (cos, sin [B, R] of
    its first position), then q[i]'s attention over session i's cache, keys selected by
    iq[i] -> o [B, Hq, D]. q [B, Hq, D]; k, v [B, Hkv, D]; iq [B, Hi, Di]; raw [B, Di];
    caches: the sessions' AttnCache of this layer; pos [B] on the device (no host value).

    Session by session with `ops` (a module or Kernels with pool_block_at, select_mask and
    attention; these references by default): the bits each row would get alone. `table`
    (session_tables.attn_table) is for the batched kernels and is not needed here, nor
    `lengths` (pos + 1, made once by the caller for the batched kernels)."""
    ops = ops or _REFERENCES
    outs = []
    for i, c in enumerate(caches):
        at = pos[i : i + 1]
        keys, values, index_keys = _put_row(c, at, k[i : i + 1], v[i : i + 1], raw[i : i + 1])
        if c.block_keys.shape[0]:
            ops.pool_block_at(
                index_keys, c.block_keys, at, cos[i : i + 1], sin[i : i + 1], weight, eps, block
            )
        mask = ops.select_mask(
            iq[i : i + 1][None],
            c.block_keys[None],
            at.view(1, 1),
            keys.shape[0],
            block,
            top_blocks,
            dense_check=False,
        )
        outs.append(
            ops.attention(
                q[i : i + 1][None], keys[None], values[None], mask, scale, at + 1, split=True
            )[0]
        )
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def causal_sessions(q, k, v, caches, pos, scale: float, table=None, lengths=None):
    """One row for each of B sessions (a sibling's lone step): session i's k[i], v[i]
    written at pos[i], then q[i]'s causal attention over session i's cache -> o [B, Hq, D].
    q [B, Hq, D]; k, v [B, Hkv, D]; caches: the sessions' AttnCache of this layer (16-bit);
    pos [B] on the device. Session by session, each row's attention that of its decode
    window in a shared round (causal_attention); `table` and `lengths` are for the batched
    kernel (triton_causal.causal_sessions) and are not needed here."""
    outs = []
    for i, c in enumerate(caches):
        if c.k_scale is not None:
            raise ValueError("causal_sessions: 16-bit caches only (an 8-bit cache: shared rounds)")
        at = pos[i : i + 1]
        c.k.index_copy_(0, at, k[i : i + 1].to(c.k.dtype))
        c.v.index_copy_(0, at, v[i : i + 1].to(c.v.dtype))
        qi = q[i : i + 1][:, None]
        outs.append(causal_attention(qi, c.k[None], c.v[None], scale, at.view(1, 1), at + 1)[:, 0])
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _put_row(c, at, k, v, raw) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Row `at` ([1] on the device) of cache c written: k, v [1, Hkv, D], raw [1, Di] ->
    (keys, values, raw indexer keys) of its whole capacity in the compute dtype: the buffers
    themselves, or an 8-bit cache's dequantized (kv8.py; no host value, so every row: those
    past the length are never read, as ever)."""
    if c.k_scale is None:
        for dst, x in ((c.k, k), (c.v, v), (c.index_keys, raw)):
            dst.index_copy_(0, at, x)
        return c.k, c.v, c.index_keys
    for dst, scales, x in (
        (c.k, c.k_scale, k),
        (c.v, c.v_scale, v),
        (c.index_keys, c.index_scale, raw),
    ):
        qx, sx = kv8.quantize(x)  # (e4m3 as bytes: torch has no e4m3 index_copy_)
        dst.view(torch.uint8).index_copy_(0, at, qx.view(torch.uint8))
        scales.index_copy_(0, at, sx)
    n = c.k.shape[0]
    return c.keys(n), c.values(n), c.index_rows(0, n)


_REFERENCES = SimpleNamespace(
    pool_block_at=pool_block_at, select_mask=select_mask, attention=attention
)
