"""attend_sessions: a lone step's attention for several sessions in one set of launches, each
kernel reading and writing every session's own caches through a table of their offsets (same
signature as `reference.attend_sessions`); the kernels are `triton.py`'s, `triton_blocks.py`'s
and `triton_select.py`'s.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import torch

from flashlane.kernels.attention import reference as attention_ref
from flashlane.kernels.attention import triton_blocks as blocks_tr
from flashlane.kernels.attention.triton import attention
from flashlane.kernels.attention.triton_kv8 import put_quantized
from flashlane.kernels.attention.triton_scores import index_scores
from flashlane.kernels.attention.triton_select import select_from_scores, select_mask
from flashlane.kernels.session_tables import attn_table


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
    table: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
) -> torch.Tensor:
    """reference.attend_sessions for B sessions in five launches whatever B (the row writes,
    the pooling, the scores, the mask and the attention: each reads and writes the
    sessions' caches in place through `table`, session_tables.attn_table, built here when not
    given; a CUDA graph needs it built before the capture). Every row runs the arithmetic of
    the per-session kernels on its own session's values, so its bits are those of one
    session alone (tests/kernels/test_session_tables.py, test_triton_kv8.py). One session
    without a table runs the per-session kernels (but an 8-bit cache's). lengths: pos + 1
    where the caller made it once for every layer (else one launch more here)."""
    # (an 8-bit cache makes its table: the per-session kernels read dequantized copies)
    if table is None and len(caches) == 1 and caches[0].k_scale is None:
        args = (q, k, v, iq, raw, caches, pos, cos, sin, weight, eps, block, top_blocks, scale)
        return attention_ref.attend_sessions(*args, ops=_PER_SESSION)
    table = attn_table(caches) if table is None else table
    first = caches[0]
    caches8 = first.k_scale is not None
    if caches8:  # e4m3 rows and their scales, quantized in the store (triton_kv8.py)
        put_quantized(first, table, pos, k, v, raw)
    else:
        blocks_tr.put_rows_three(
            [first.k, first.v, first.index_keys], ["k", "v", "index_keys"], table, pos, [k, v, raw]
        )
    blocks_tr.pool_block_at(
        first.index_keys,
        first.block_keys,
        pos,
        cos,
        sin,
        weight,
        eps,
        block,
        table=table,
        index_scale=first.index_scale,
    )
    nb = max(c.block_keys.shape[0] for c in caches)
    num_keys = max(c.k.shape[0] for c in caches)
    # every row here is a decode row (a lone or drafted step's): their own scores' tile
    scores = index_scores(
        iq[:, None], first.block_keys[None], table, nb, pos[:, None], block, decode=True
    )
    mask = select_from_scores(scores, pos[:, None], num_keys, block, top_blocks)
    lengths = pos + 1 if lengths is None else lengths
    kv = (first.k_scale[None], first.v_scale[None]) if caches8 else None
    return attention(
        q[:, None],
        first.k[None],
        first.v[None],
        mask,
        scale,
        lengths,
        table,
        pos[:, None],
        scales=kv,
        split=True,
    )[:, 0]


# the per-session Triton kernels, for reference.attend_sessions' loop (decode rows, as above)
_PER_SESSION = SimpleNamespace(
    pool_block_at=blocks_tr.pool_block_at,
    select_mask=partial(select_mask, decode=True),
    attention=attention,
)
