"""The chunked gated delta rule through fla-core's Triton kernels (forward only).

Every call is varlen: the sequences lie back to back in one [1, N] batch with their bounds in
`cu_seqlens`, so a round's prompt pieces are one call per layer (each piece alone was ~10
launches and fla's Python, a piece a layer). Each chunk's arithmetic reads only its own
sequence, and fla-core 0.6's autotune keys hold no length (chunk_local_cumsum's holds B,
always 1 here), so a piece's bits are the same alone, first, last or beside any other; one
piece alone also goes varlen, so the bits never depend on how many share the call.

The bounds go to the GPU without a wait: fla would make chunk_indices from cu_seqlens with
a copy from pageable memory (the host then waits for the stream); here both are made on the
host, pinned, copied without blocking, and kept per tuple of lengths (a round's shapes recur).

fla-core 0.6 has two backends that would split a sequence by the call's longest one (and so
change its bits beside others): intra-card CP (off unless FLA_INTRACARD_CP is set) and
FlashQLA (only where the flash_qla package is installed; the H200 image has none).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from flashlane.kernels.gdn import reference


def _fla_chunk():
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception:  # fla-core is an optional, GPU-only dependency
        return None
    return chunk_gated_delta_rule


@lru_cache(maxsize=256)
def _bounds(lengths: tuple[int, ...], chunk: int, device: torch.device):
    """(cu_seqlens [n+1], chunk_indices [chunks, 2]: (sequence, chunk in it)) on `device`,
    int64, copied from pinned host memory without a wait."""
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    pairs = [(i, c) for i, n in enumerate(lengths) for c in range(-(-n // chunk))]
    host = torch.tensor(cu + [x for pair in pairs for x in pair], dtype=torch.long)
    pinned = host.pin_memory()  # kept with the copy: it is read after this returns
    both = pinned.to(device, non_blocking=True)
    return both[: len(cu)], both[len(cu) :].view(-1, 2), host[: len(cu)], pinned


# Rows of the call that picks fla's tiles. fla-core autotunes each kernel on its first call
# for a key that holds no length, so whatever shape came first (a warm round's 20-token
# prompt, a test's 1-row piece) chose the tiles, and so the bits, of every later prefill in
# the process. One call of a prefill's size picks them first, whatever the traffic.
TUNE_ROWS = 4096
# Then calls that compile the other specialisations Triton makes of fla's kernels: the rows T
# equal to 1, dividing by 16 or neither, and 1, 2 or 3 sequences (chunk_indices follows
# cu_seqlens in one buffer, so their count moves its alignment). Served at 16 streams on the
# H100, four of them compiled mid-round, ~2 s each (serve_cuda_h100_5c561f3_*).
SHAPES = ((1,), (5,), (64,), (5, 1), (64, 64), (37, 5, 1))
_tuned: set[tuple] = set()


def _tune(fla_chunk, q, k, v, state, chunk: int) -> None:
    """fla's first call for these heads, dtypes and chunk, on zeros of TUNE_ROWS rows, then
    of each of SHAPES."""
    key = (*q.shape[2:], *v.shape[2:], q.dtype, v.dtype, chunk, v.device, state is None)
    if key in _tuned:
        return
    _tuned.add(key)
    for lengths in ((TUNE_ROWS,), *SHAPES):
        rows = sum(lengths)
        zeros = [x.new_zeros(1, rows, *x.shape[2:]) for x in (q, k, v)]
        g = q.new_zeros(1, rows, q.shape[2], dtype=torch.float32)
        beta = q.new_zeros(1, rows, q.shape[2])
        initial = None if state is None else state.new_zeros(len(lengths), *state.shape[1:])
        _varlen(fla_chunk, *zeros, g, beta, initial, lengths, chunk)


def _varlen(fla_chunk, q, k, v, g, beta, state, lengths: tuple[int, ...], chunk: int):
    """fla's call over [1, sum(lengths)] rows holding these sequences -> (o, final states)."""
    cu, indices, cu_host, _ = _bounds(lengths, chunk, v.device)
    return fla_chunk(
        q,
        k,
        v,
        g,
        beta,
        scale=1.0,
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=False,
        cu_seqlens=cu,
        cu_seqlens_cpu=cu_host,
        chunk_indices=indices,
        chunk_size=chunk,
    )


def chunk_gdn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor | None,
    chunk: int = reference.CHUNK,
    lengths: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """reference.chunk_gdn's contract (q scaled, q and k normalised, g the log decay), through
    fla's kernels. lengths: the [1, sum] rows are these sequences back to back (state [n, ...]
    or None); without it each of the B rows is one sequence. Falls back to the reference when
    fla cannot be imported, the tensors are not on a GPU, or `chunk` is not one fla supports.
    Returns (o [B, T, H, Dv] in v's dtype, final states [n or B, H, Dk, Dv] fp32)."""
    fla_chunk = _fla_chunk()
    if fla_chunk is None or not v.is_cuda or chunk not in (16, 32, 64) or v.shape[1] == 0:
        return reference.chunk_gdn(q, k, v, g, beta, state, chunk, lengths)
    b, t = v.shape[:2]
    if lengths is None:  # B sequences of T rows: the same varlen call, flattened
        lengths = [t] * b
    elif b != 1 or sum(lengths) != t:
        raise ValueError(f"chunk_gdn: lengths {lengths} do not tile [{b}, {t}] rows")
    # fla's kernels want one dtype for q, k, v (bf16/fp16 or fp32); g is cumsummed in fp32
    dt = v.dtype if v.dtype in (torch.bfloat16, torch.float16, torch.float32) else torch.float32

    def flat(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return x.reshape(1, b * t, *x.shape[2:]).to(dtype).contiguous()

    q, k, v_in = flat(q, dt), flat(k, dt), flat(v, dt)
    state = state.to(torch.float32).contiguous() if state is not None else None
    _tune(fla_chunk, q, k, v_in, state, chunk)
    g, beta = flat(g, torch.float32), flat(beta, dt)
    o, final = _varlen(fla_chunk, q, k, v_in, g, beta, state, tuple(lengths), chunk)
    return o.view(b, t, *o.shape[2:]).to(v.dtype), final.to(torch.float32)
