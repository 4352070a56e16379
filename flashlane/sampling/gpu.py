"""The keyed draw for a whole batch of rows in one call, with torch ops on the logits' device.

Returns the CPU path's tokens (choose.draw_rows). Plain torch, so it runs on the CPU too and a
CI test holds it to the CPU path; on CUDA it is the verify round's sampler.

Per row: greedy rows take the first maximum. Sampled rows keep a pool {z >= floor}, which is
a prefix of the candidate order: the floor is the k-th largest z for top_k, a mass bound for
top_p, and otherwise the lowest z that could still beat the first candidate's score (or pass
min_p). Pools are packed into a [rows, width] tensor, sorted only where order matters, and
scored there. Sums run in the device's order, not DESIGN's left-to-right order, so a top_p cut
is taken only when an error bound proves the exact sums cut at the same id; a row too close to
call (about one in 10**5 wide flat rows) is drawn on the CPU instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from flashlane.sampling.choose import (
    GREEDY_TEMPERATURE,
    DrawSpec,
    SampleError,
    checked_ids,
    draw_rows,
)
from flashlane.sampling.keyed import gumbel_torch, row_key, row_keys_torch, uniforms_torch
from flashlane.sampling.prune import NOISE_BOUND

F64 = torch.float64
NEG_INF = -math.inf


def draw_rows_gpu(logits: torch.Tensor, specs: Sequence[DrawSpec]) -> list[int | SampleError]:
    """One draw per row of fp32 logits [N, V] on any device; a row's error in its slot."""
    n = logits.shape[0]
    out: list[int | SampleError | None] = [None] * n
    l = logits.to(F64)
    _mark_bad_logits(logits, out)
    _adjust(l, specs, out)
    greedy = [i for i in range(n) if out[i] is None and _is_greedy(specs[i])]
    sampled = [i for i in range(n) if out[i] is None and not _is_greedy(specs[i])]
    if greedy:
        top, ids = l[greedy].max(1)  # the first maximum: ties go to the lower id
        for i, t, v in zip(greedy, ids.tolist(), top.tolist()):
            out[i] = t if v > NEG_INF else SampleError("no finite candidate logit")
    for ordered in (False, True):
        rows = [i for i in sampled if _is_ordered(specs[i]) == ordered]
        if rows:
            z = l[rows].div_(_col([specs[i].params.temperature for i in rows], l.device))
            for i, r in zip(rows, _draw_pooled(z, [specs[i] for i in rows], ordered)):
                out[i] = r
    # Rows the device could not settle (a top_p cut within rounding) go to the CPU path.
    unsettled = [i for i in range(n) if out[i] is None]
    if unsettled:
        cpu = draw_rows(logits[unsettled], [specs[i] for i in unsettled])
        for i, r in zip(unsettled, cpu):
            out[i] = r
    return out  # type: ignore[return-value]


def _is_greedy(spec: DrawSpec) -> bool:
    return spec.params.temperature < GREEDY_TEMPERATURE


def _is_ordered(spec: DrawSpec) -> bool:
    """Whether the row needs the candidate order (top_k or top_p)."""
    return spec.params.top_k > 0 or spec.params.top_p < 1.0


def _col(values: Sequence[float], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=F64, device=device)[:, None]


def _mark_bad_logits(logits: torch.Tensor, out: list) -> None:
    nan = torch.isnan(logits)
    inf = torch.isposinf(logits)
    flags = torch.stack([nan.any(1), inf.any(1)], 1).tolist()
    for i, (has_nan, has_inf) in enumerate(flags):
        if has_nan or has_inf:
            bad = nan[i] if has_nan else inf[i]
            first = int(bad.nonzero()[0, 0])
            out[i] = SampleError(f"{'NaN' if has_nan else '+inf'} logit at id {first}")


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
        ids = checked_ids([*spec.prompt_ids, *spec.reply_ids], vocab, "a seen token")
        seen += [(i, t, p.repetition_penalty) for t in np.unique(ids).tolist()]
    if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
        ids = checked_ids(spec.reply_ids, vocab, "a reply token")
        ids, c = np.unique(ids, return_counts=True)
        pres, freq = p.presence_penalty, p.frequency_penalty
        counts += [(i, t, n, pres, freq) for t, n in zip(ids.tolist(), c.tolist())]


def _columns(rows: list[tuple], device: torch.device) -> list[torch.Tensor]:
    """(row, id, value...) tuples -> an int64 row column, an int64 id column, float64 columns."""
    cols = list(zip(*rows))
    ints = [torch.tensor(c, dtype=torch.int64, device=device) for c in cols[:2]]
    return ints + [torch.tensor(c, dtype=F64, device=device) for c in cols[2:]]


def _draw_pooled(
    z: torch.Tensor, specs: Sequence[DrawSpec], ordered: bool
) -> list[int | SampleError | None]:
    """Steps 2-6 for z = adjusted logits / T [m, V]; None where the device cannot settle."""
    dev, (m, vocab) = z.device, z.shape
    params = [s.params for s in specs]
    zmax, i0 = z.max(1)
    no_candidate = (zmax == NEG_INF).tolist()
    zmax = torch.where(zmax == NEG_INF, 0.0, zmax)  # keeps such rows free of NaN
    keys = row_keys_torch([row_key(s.seed, s.position) for s in specs], dev)
    min_p = _col([p.min_p for p in params], dev)
    e_total = None
    if ordered:
        floor, e_total = _order_floors(z, zmax, params)
    else:
        # i0 survives every filter, so its score bounds the winner's from below.
        b0 = zmax + gumbel_torch(uniforms_torch(keys, i0))
        floor = b0 - NOISE_BOUND - 1.0
        floor = torch.maximum(floor, zmax + torch.log(min_p[:, 0]) - 1e-9 * (1 + zmax.abs()))
    whole = floor == NEG_INF  # the pool holds every candidate
    pz, pid, count = _pack(z, floor, sort=ordered)
    rank = torch.arange(pz.shape[1], device=dev)[None, :]
    keep = rank < count[:, None]
    e = torch.exp(pz - zmax[:, None])  # packing slots hold -inf: e = 0 there
    settled = torch.ones(m, dtype=torch.bool, device=dev)
    if ordered:
        top_k = torch.tensor([p.top_k or vocab for p in params], device=dev)
        keep &= rank < top_k[:, None]
        keep, settled = _top_p_keep(e, keep, rank, params, e_total, whole, vocab)
    keep &= e >= min_p
    scores = torch.where(keep, pz + gumbel_torch(uniforms_torch(keys[:, None], pid)), NEG_INF)
    best = scores.max(1, keepdim=True).values
    tokens = torch.where(scores == best, pid, vocab).min(1).values
    out: list[int | SampleError | None] = []
    for token, ok, empty in zip(tokens.tolist(), settled.tolist(), no_candidate):
        out.append(SampleError("no finite candidate logit") if empty else token if ok else None)
    return out


def _order_floors(
    z: torch.Tensor, zmax: torch.Tensor, params: Sequence
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pool floors for rows that need the order, and each row's sum of exp(z - zmax) (used by
    top_p rows without top_k)."""
    vocab = z.shape[1]
    ks = [min(p.top_k, vocab) for p in params]
    e_total = torch.zeros_like(zmax)
    if min(ks) == 0:  # some row cuts top_p over the whole row
        e_total = torch.exp(z - zmax[:, None]).sum(1)
    top_p = torch.tensor([p.top_p for p in params], dtype=F64, device=z.device)
    # Ids below tau hold at most (total - target) / 2 together, so the cut lies above them.
    tau = (e_total - top_p * e_total) / (2 * vocab)
    floor = torch.where(tau > 0, zmax + torch.log(tau) - 1.0, NEG_INF)
    if max(ks) > 0:
        kth = torch.topk(z, max(ks), dim=1).values  # [m, max k], descending
        at_k = kth.gather(1, torch.tensor([max(k - 1, 0) for k in ks], device=z.device)[:, None])
        with_k = torch.tensor([k > 0 for k in ks], device=z.device)
        floor = torch.where(with_k, at_k[:, 0], floor)
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
    params: Sequence,
    e_total: torch.Tensor,
    whole: torch.Tensor,
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 4 on packed rows in candidate order: keep [m, width] narrowed to the shortest
    prefix reaching top_p * S, and whether each row's cut is proven (see the module doc)."""
    dev = e.device
    top_p = torch.tensor([p.top_p for p in params], dtype=F64, device=dev)
    has_k = torch.tensor([p.top_k > 0 for p in params], device=dev)
    running = torch.cumsum(torch.where(keep, e, 0.0), 1)
    total = torch.where(has_k, running[:, -1], e_total)
    target = top_p * total
    avail = keep.sum(1)
    cut = ((running < target[:, None]) & keep).sum(1)  # first position reaching the target
    reached = cut < avail
    at = running.gather(1, cut.clamp(max=running.shape[1] - 1)[:, None])[:, 0]
    before = running.gather(1, (cut - 1).clamp(min=0)[:, None])[:, 0]
    before = torch.where(cut > 0, before, NEG_INF)
    # Any two orders of summing n nonnegative terms differ by at most 2 n 2**-53 of the total;
    # twice that, as S, the running sums and exp may each differ from the CPU's.
    slack = (4 * vocab + 16) * 2.0**-53 * total
    whole = has_k | whole
    proven = torch.where(
        reached,
        (at - target > slack) & (target - before > slack),
        (target - before > slack) & whole,
    )
    applies = top_p < 1.0
    narrowed = keep & torch.where(reached[:, None], rank <= cut[:, None], True)
    keep = torch.where(applies[:, None], narrowed, keep)
    return keep, proven | ~applies
