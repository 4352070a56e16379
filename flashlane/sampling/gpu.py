"""The keyed draw for a whole batch of rows in one call, with torch ops on the logits' device.

Returns the CPU path's tokens (choose.draw_rows). Plain torch, so it runs on the CPU too and a
CI test holds it to the CPU path; on CUDA it is the verify round's sampler, where the common rows
(greedy, plain, min_p, top_k, top_p, without penalties or bias) go to triton_draw's fused
kernels and only the rest, or a row they cannot settle, come here.

Greedy rows take the first maximum. A sampled row keeps a pool {z >= floor}, which is a prefix
of the candidate order (prune.py): the floor is the k-th largest z for top_k, the edge of a
mass histogram for top_p, and otherwise the lowest z that could still beat the first
candidate's score (or pass min_p). Pools are packed into a [rows, width] tensor, sorted only
where order matters, and scored there. Sums run in the device's order, not DESIGN's left to
right, so a top_p cut is taken only when an error bound proves the exact sums cut at the same
id; a row too close to call (rare, except on degenerate rows such as equal logits, where a
running sum can hit top_p * S exactly) is drawn by the CPU path instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from flashlane.sampling.choose import (
    GREEDY_TEMPERATURE,
    DrawSpec,
    SampleError,
    bad_logit,
    checked_ids,
    draw_rows,
    no_candidate,
    seen_ids,
)
from flashlane.sampling.keyed import gumbel_torch, row_key, row_keys_torch, uniforms_torch
from flashlane.sampling.prune import NOISE_BOUND, SLICES, SLICES_PER_NAT

F64 = torch.float64
NEG_INF = -math.inf


def draw_rows_gpu(
    logits: torch.Tensor, specs: Sequence[DrawSpec], fused: bool | None = None
) -> list[int | SampleError]:
    """One draw per row of fp32 logits [N, V] on any device; a row's error in its slot.

    `fused`: draw the common rows with triton_draw's kernels (default: on CUDA, where Triton
    imports); the rest, and rows they cannot settle, take the torch path below."""
    if fused is None:
        fused = logits.is_cuda
    kernels = fused_kernels() if fused else None
    if kernels is None:
        return _draw_rows_torch(logits, specs)
    out = kernels.draw_rows_fused(logits, specs)
    rest = [i for i, r in enumerate(out) if r is None]
    if rest:
        for i, r in zip(rest, _draw_rows_torch(logits[rest], [specs[i] for i in rest])):
            out[i] = r
    return out  # type: ignore[return-value]


_TRITON: list = []  # the fused_draw module, or None where Triton does not import


def fused_kernels():
    """The fused_draw module (the host side of triton_draw's kernels), or None where Triton
    does not import (imported once)."""
    if not _TRITON:
        try:
            from flashlane.sampling import fused_draw
        except ImportError:
            fused_draw = None
        _TRITON.append(fused_draw)
    return _TRITON[0]


def _draw_rows_torch(logits: torch.Tensor, specs: Sequence[DrawSpec]) -> list[int | SampleError]:
    """The plain torch path for every row."""
    n = logits.shape[0]
    out: list[int | SampleError | None] = [None] * n
    _mark_bad_logits(logits, out)
    l = logits.to(F64)
    _adjust(l, specs, out)
    live = [i for i in range(n) if out[i] is None]
    greedy = [i for i in live if specs[i].params.temperature < GREEDY_TEMPERATURE]
    if greedy:
        top, ids = _rows(l, greedy).max(1)  # the first maximum: ties go to the lower id
        for i, (t, v) in zip(greedy, torch.stack([ids.to(F64), top], 1).tolist()):
            out[i] = int(t) if math.isfinite(v) else no_candidate(v)
    sampled = [i for i in live if out[i] is None]
    for ordered in (False, True):
        rows = [i for i in sampled if _is_ordered(specs[i], l.shape[1]) == ordered]
        if rows:
            table = _Table.of([specs[i] for i in rows], l.shape[1], l.device)
            z = _rows(l, rows).div_(table.temperature[:, None])
            for i, r in zip(rows, _draw_pooled(z, table, ordered)):
                out[i] = r
    # Rows the device could not settle (a top_p cut within rounding) go to the CPU path.
    unsettled = [i for i in live if out[i] is None]
    if unsettled:
        for i, r in zip(unsettled, draw_rows(logits[unsettled], [specs[i] for i in unsettled])):
            out[i] = r
    return out  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class _Table:
    """Per-row draw parameters as device columns [m], copied in one transfer."""

    keys: torch.Tensor  # int64 row_key(seed, position)
    temperature: torch.Tensor
    top_k: torch.Tensor  # top_k, or V when 0 (float64: exact for any vocabulary)
    top_p: torch.Tensor
    min_p: torch.Tensor
    has_k: torch.Tensor  # bool: 0 < top_k < V (a larger top_k keeps every candidate)
    max_k: int  # the largest such top_k; 0 if none
    all_k: bool  # every row has such a top_k
    any_top_p: bool  # host-side flags: skip the work no row needs
    any_min_p: bool

    @staticmethod
    def of(specs: Sequence[DrawSpec], vocab: int, device: torch.device) -> _Table:
        ps = [s.params for s in specs]
        cols = [[p.temperature, min(p.top_k or vocab, vocab), p.top_p, p.min_p] for p in ps]
        t, k, top_p, min_p = torch.tensor(cols, dtype=F64).to(device).unbind(1)
        keys = row_keys_torch([row_key(s.seed, s.position) for s in specs], device)
        ks = [p.top_k for p in ps if 0 < p.top_k < vocab]
        any_top_p, any_min_p = any(p.top_p < 1 for p in ps), any(p.min_p > 0 for p in ps)
        max_k, all_k = max(ks, default=0), len(ks) == len(ps)
        return _Table(keys, t, k, top_p, min_p, k < vocab, max_k, all_k, any_top_p, any_min_p)


def _rows(l: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """l[rows], without the copy when that is every row (then l is overwritten)."""
    return l if rows == list(range(l.shape[0])) else l[rows]


def _is_ordered(spec: DrawSpec, vocab: int) -> bool:
    """Whether the row needs the candidate order (top_k below V, or top_p)."""
    return 0 < spec.params.top_k < vocab or spec.params.top_p < 1.0


def _mark_bad_logits(logits: torch.Tensor, out: list) -> None:
    top = logits.amax(1)  # NaN propagates through amax, so one pass finds both problems
    for i, v in enumerate(top.tolist()):
        if math.isnan(v):
            word, bad = "NaN", torch.isnan(logits[i])
        elif v == math.inf:
            word, bad = "+inf", torch.isposinf(logits[i])
        else:
            continue
        out[i] = bad_logit(word, int(bad.nonzero()[0, 0]))


def _adjust(l: torch.Tensor, specs: Sequence[DrawSpec], out: list) -> None:
    """Step 0 in place on float64 logits [N, V], with choose.adjusted's arithmetic op for op.
    Rows already failed are skipped; a row with an id outside the vocabulary fails."""
    bias: list[tuple[int, int, float]] = []
    seen: list[tuple[int, int, float]] = []
    counts: list[tuple[int, int, int, float, float]] = []
    for i, spec in enumerate(specs):
        if out[i] is None:
            try:
                _row_adjustments(i, spec, l.shape[1], bias, seen, counts)
            except SampleError as err:
                out[i] = err
    if bias:
        r, t, v = _columns(bias, l.device)
        l.index_put_((r, t), l[r, t] + v)
    if seen:
        r, t, rp = _columns(seen, l.device)
        v = l[r, t]
        l.index_put_((r, t), torch.where(v > 0, v / rp, v * rp))
    if counts:
        r, t, c, pres, freq = _columns(counts, l.device)
        l.index_put_((r, t), l[r, t] - (pres * (c > 0) + freq * c))


def _row_adjustments(
    i: int, spec: DrawSpec, vocab: int, bias: list, seen: list, counts: list
) -> None:
    """Appends row i's (row, id, values...) entries for each adjustment it uses."""
    p = spec.params
    if p.logit_bias:
        checked_ids(list(p.logit_bias), vocab, "logit_bias")
        bias += [(i, t, v) for t, v in p.logit_bias.items()]
    if p.repetition_penalty != 1.0:
        ids = checked_ids(seen_ids(spec), vocab, "a seen token")
        seen += [(i, t, p.repetition_penalty) for t in np.unique(ids).tolist()]
    if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
        ids = checked_ids(spec.reply_ids, vocab, "a reply token")
        ids, c = np.unique(ids, return_counts=True)
        pres, freq = p.presence_penalty, p.frequency_penalty
        counts += [(i, t, n, pres, freq) for t, n in zip(ids.tolist(), c.tolist())]


def _columns(rows: list[tuple], device: torch.device) -> list[torch.Tensor]:
    """(row, id, value...) tuples -> int64 row and id columns, then float64 columns."""
    cols = list(zip(*rows))
    ints = [torch.tensor(c, dtype=torch.int64, device=device) for c in cols[:2]]
    return ints + [torch.tensor(c, dtype=F64, device=device) for c in cols[2:]]


def _draw_pooled(z: torch.Tensor, table: _Table, ordered: bool) -> list[int | SampleError | None]:
    """Steps 2-6 for z = adjusted logits / T [m, V]; None where the device cannot settle."""
    vocab = z.shape[1]
    top, i0 = z.max(1)
    zmax = torch.where(torch.isfinite(top), top, 0.0)  # such rows fail; 0 keeps them tame
    e_total = None
    if ordered:
        floor, e_total = _order_floors(z, zmax, table)
    else:
        # i0 survives every filter, so its score bounds the winner's from below.
        b0 = zmax + gumbel_torch(uniforms_torch(table.keys, i0))
        floor = b0 - NOISE_BOUND - 1.0
        if table.any_min_p:
            min_p_floor = zmax + torch.log(table.min_p) - 1e-9 * (1 + zmax.abs())
            floor = torch.maximum(floor, min_p_floor)
    pz, pid, count = _pack(z, floor, sort=ordered)
    rank = torch.arange(pz.shape[1], device=z.device)[None, :]
    keep = rank < count[:, None]
    e = torch.exp(pz - zmax[:, None])  # packing slots hold -inf: e = 0 there
    settled = torch.ones_like(zmax, dtype=torch.bool)
    if ordered:
        keep &= rank < table.top_k[:, None]
    if ordered and table.any_top_p:
        keep, settled = _top_p_keep(e, keep, rank, table, e_total, floor == NEG_INF, vocab)
    if table.any_min_p:
        keep &= e >= table.min_p[:, None]
    noise = gumbel_torch(uniforms_torch(table.keys[:, None], pid))
    scores = torch.where(keep, pz + noise, NEG_INF)
    best = scores.max(1, keepdim=True).values
    tokens = torch.where(scores == best, pid, vocab).min(1).values
    rows = torch.stack([tokens.to(F64), settled.to(F64), top], 1).tolist()  # one transfer
    return [
        no_candidate(v) if not math.isfinite(v) else int(t) if ok else None for t, ok, v in rows
    ]


def _order_floors(
    z: torch.Tensor, zmax: torch.Tensor, table: _Table
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pool floors for rows that need the order, and each row's sum of exp(z - zmax) (used
    by top_p rows without top_k; zeros when there are none)."""
    m = z.shape[0]
    e_total = torch.zeros_like(zmax)
    floor = torch.full_like(zmax, NEG_INF)
    if not table.all_k:
        # prune.py's mass by slices of zmax - z: the narrowest prefix that reaches top_p * S,
        # with a slice to spare. Atomic float adds: only a guess, checked by _top_p_keep.
        x = z - zmax[:, None]
        e = torch.exp(x)
        e_total = e.sum(1)
        slices = (x * -SLICES_PER_NAT).clamp(max=SLICES - 1).long()
        mass = torch.zeros(m, SLICES, dtype=F64, device=z.device).scatter_add_(1, slices, e)
        short = mass.cumsum(1) < (table.top_p * e_total * (1 + 1e-6))[:, None]
        edge = short.sum(1)  # the first slice whose running mass reaches it
        floor = torch.where(edge < SLICES - 2, zmax - (edge + 2) / SLICES_PER_NAT, NEG_INF)
    if table.max_k > 0:
        kth = torch.topk(z, table.max_k, dim=1).values  # [m, max k], descending
        at = (table.top_k.long().clamp(max=table.max_k) - 1)[:, None]
        floor = torch.where(table.has_k, kth.gather(1, at)[:, 0], floor)
    return floor, e_total


def _pack(
    z: torch.Tensor, floor: torch.Tensor, sort: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ids with finite z >= floor, packed left: z [m, width] (-inf past the end), ids
    [m, width] (V past the end), counts [m]. Ids ascend, or with `sort` follow the candidate
    order (a stable sort of ascending ids by z descending)."""
    m, vocab = z.shape
    pool = (z >= floor[:, None]) & (z > NEG_INF)
    count = pool.sum(1)
    rows, ids = pool.nonzero(as_tuple=True)  # row-major: ids ascend within a row
    width = max(int(count.max()), 1)
    slot = torch.arange(rows.numel(), device=z.device) - (count.cumsum(0) - count)[rows]
    pz = torch.full((m, width), NEG_INF, dtype=F64, device=z.device)
    pid = torch.full((m, width), vocab, dtype=torch.int64, device=z.device)
    pz[rows, slot] = z[rows, ids]
    pid[rows, slot] = ids
    if sort:
        pz, perm = torch.sort(pz, dim=1, descending=True, stable=True)
        pid = pid.gather(1, perm)
    return pz, pid, count


def _top_p_keep(
    e: torch.Tensor,
    keep: torch.Tensor,
    rank: torch.Tensor,
    table: _Table,
    e_total: torch.Tensor,
    whole: torch.Tensor,
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 4 on packed rows in candidate order: `keep` [m, width] narrowed to the shortest
    prefix reaching top_p * S, and whether each row's cut is proven. `whole` [m]: the pool
    holds every candidate, so "no prefix reaches the target" can keep them all."""
    running = torch.cumsum(torch.where(keep, e, 0.0), 1)
    total = torch.where(table.has_k, running[:, -1], e_total)
    target = table.top_p * total
    cut = ((running < target[:, None]) & keep).sum(1)  # the first position reaching it
    reached = cut < keep.sum(1)
    at = running.gather(1, cut.clamp(max=running.shape[1] - 1)[:, None])[:, 0]
    before = running.gather(1, (cut - 1).clamp(min=0)[:, None])[:, 0]
    before = torch.where(cut > 0, before, NEG_INF)
    # Two orders of summing n nonnegative terms differ by at most 2 n 2**-53 of the total;
    # twice that, as S, the running sums and exp may each differ from the CPU's.
    slack = (4 * vocab + 16) * 2.0**-53 * total
    proven = torch.where(
        reached,
        (at - target > slack) & (target - before > slack),
        (target - before > slack) & (table.has_k | whole),
    )
    applies = table.top_p < 1.0
    narrowed = keep & torch.where(reached[:, None], rank <= cut[:, None], True)
    keep = torch.where(applies[:, None], narrowed, keep)
    return keep, proven | ~applies
