"""Steps 2-6 of the keyed draw (DESIGN.md section 5) touching only the ids that can matter.

Three facts make it exact:
- any set {z >= floor} is a prefix of the candidate order (z descending, id ascending), so its
  order and its running sums are those of the whole row;
- the first candidate i0 survives every filter, so its score is a lower bound on the winner's;
- no noise exceeds GUMBEL_MAX, so an id whose z + GUMBEL_MAX stays below a score already found
  can neither win nor tie, and needs no hash or log.
Also the shared pieces of the definition: the candidate order, the blocked sum S, top_p's cut.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from flashlane.request import SamplingParams
from flashlane.sampling.keyed import GUMBEL_MAX, gumbel_np, uniforms_np

BLOCK = 1024  # top_p's S adds ids in blocks of this many (step 4)
# Above any noise the hash can give; the slack keeps pruning safe from rounding.
NOISE_BOUND = GUMBEL_MAX + 1e-6
# An id more than TAIL below the best score so far needs noise above TAIL - 1e-3 to win, that
# is u >= U_TAIL: comparing u first leaves logs for about 3e-4 of such ids.
TAIL = 8.0
U_TAIL = math.exp(-math.exp(-(TAIL - 1e-3)))
CHUNK = 8 * BLOCK  # ids per pass over wide rows: small temporaries, no page faults
# top_p alone sums exp(z - zmax) by slices of zmax - z, 1/64 nat wide over 64 nats.
SLICES, SLICES_PER_NAT = 4096, 64


def sorted_by_z(z: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Ascending `ids` in candidate order: z descending, then id ascending (a stable sort)."""
    return ids[np.argsort(-z[ids], kind="stable")]


def block_sums(values: np.ndarray, overwrite: bool = False) -> np.ndarray:
    """Each 1024-value block summed left to right (np.cumsum adds strictly in order);
    `overwrite` lets it reuse `values` as its workspace."""
    whole = values.size // BLOCK * BLOCK
    blocks = values[:whole].reshape(-1, BLOCK)
    sums = np.cumsum(blocks, axis=1, out=blocks if overwrite else None)[:, -1].copy()
    if whole < values.size:
        sums = np.append(sums, np.cumsum(values[whole:])[-1])
    return sums


def blocked_sum(values: np.ndarray) -> float:
    """Step 4's S over dense values [V]: the block sums, added left to right."""
    sums = block_sums(values)
    return float(np.cumsum(sums)[-1]) if sums.size else 0.0


def top_p_count(e_in_order: np.ndarray, total: float, top_p: float) -> int:
    """Length of the shortest prefix whose running sum reaches top_p * total; all if none."""
    running = np.cumsum(e_in_order)
    i = int(np.searchsorted(running, top_p * total, side="left"))
    return i + 1 if i < running.size else running.size


def pruned_choice(z: np.ndarray, p: SamplingParams, key: int) -> int:
    """Steps 2-6 for z = adjusted logits / T [V] with a finite maximum; key = row_key."""
    i0 = int(np.argmax(z))  # the first candidate in order
    zmax = float(z[i0])
    bound = float(z[i0] + gumbel_np(uniforms_np(key, np.array([i0])))[0])
    top_k = p.top_k if p.top_k < z.size else 0  # top_k >= V keeps every candidate
    if top_k > 0 or p.top_p < 1.0:
        kept = _top_filtered(z, zmax, top_k, p.top_p)
    else:
        # No order needed: keep the ids that could reach i0's score (and pass min_p).
        floor = bound - NOISE_BOUND - 1.0
        if p.min_p > 0.0:
            floor = max(floor, zmax + math.log(p.min_p) - 1e-9 * (1.0 + abs(zmax)))
        kept = np.flatnonzero(z >= floor)
    if p.min_p > 0.0:
        kept = kept[np.exp(z[kept] - zmax) >= p.min_p]
    return _best(z, kept, key, bound)


def _top_filtered(z: np.ndarray, zmax: float, top_k: int, top_p: float) -> np.ndarray:
    """The ids steps 3-4 keep, in no particular order, without sorting the whole row."""
    if top_k > 0:
        order = sorted_by_z(z, np.sort(_first_k(z, top_k)))
        if top_p < 1.0:
            e = np.exp(z[order] - zmax)
            order = order[: top_p_count(e, _sparse_blocked_sum(order, e), top_p)]
        return order
    total, mass = _exp_sum_and_mass(z, zmax)
    kept = _cut_in_slice(z, zmax, mass, top_p * total)
    if kept is None:  # too close to call without the exact order
        order = sorted_by_z(z, np.flatnonzero(np.isfinite(z)))
        kept = order[: top_p_count(np.exp(z[order] - zmax), total, top_p)]
    return kept


def _first_k(z: np.ndarray, k: int) -> np.ndarray:
    """The first k candidates (unordered), ties at the k-th value to the lower ids."""
    z_k = float(torch.topk(torch.from_numpy(z), k, sorted=False).values.min())  # k-th largest
    if z_k == -math.inf:  # fewer than k candidates: all of them
        return np.flatnonzero(np.isfinite(z))
    pool = np.flatnonzero(z >= z_k)
    zp = z[pool]
    above, at = pool[zp > z_k], pool[zp == z_k]
    return np.concatenate([above, at[: k - above.size]])


def _exp_sum_and_mass(z: np.ndarray, zmax: float) -> tuple[float, np.ndarray]:
    """blocked_sum(exp(z - zmax)), a chunk at a time in one reused buffer (chunks start on
    block edges; -inf ids give 0, as step 4 counts non-candidates), and that mass by slices
    of zmax - z (float sums, only to pick a pool)."""
    buf = np.empty(min(CHUNK, z.size))
    sums, mass = [], np.zeros(SLICES)
    for start in range(0, z.size, CHUNK):
        x = np.subtract(z[start : start + CHUNK], zmax, out=buf[: min(CHUNK, z.size - start)])
        slices = _slice_of(x)
        mass += np.bincount(slices, weights=np.exp(x, out=x), minlength=SLICES)
        sums.append(block_sums(x, overwrite=True))
    return float(np.cumsum(np.concatenate(sums))[-1]), mass


def _sparse_blocked_sum(ids: np.ndarray, values: np.ndarray) -> float:
    """blocked_sum of a row that is `values` at `ids` and 0 elsewhere (adding 0.0 is exact, so
    non-candidates and empty blocks can be skipped)."""
    if ids.size > 4 * BLOCK:
        dense = np.zeros(int(ids.max()) + 1)
        dense[ids] = values
        return blocked_sum(dense)
    by_id = np.argsort(ids)
    total, acc, block = 0.0, 0.0, -1
    for i, v in zip(ids[by_id].tolist(), values[by_id].tolist()):
        if i // BLOCK != block:
            total, acc, block = total + acc, 0.0, i // BLOCK
        acc += v
    return total + acc


def _slice_of(x: np.ndarray) -> np.ndarray:
    """The slice of x = z - zmax: floor(-x * SLICES_PER_NAT), the last one past the edge.
    Monotone in z, so slices follow the candidate order (the power-of-two scale is exact)."""
    return np.minimum(x * -SLICES_PER_NAT, SLICES - 1).astype(np.intp)


def _cut_in_slice(z: np.ndarray, zmax: float, mass: np.ndarray, target: float) -> np.ndarray | None:
    """Step 4's kept ids for top_p alone, sorting only the slice where the running sum crosses
    `target`: the earlier slices are kept whole. `mass` sums in another order than the spec's
    left to right, so the cut is taken only when an error bound proves the exact sums cross
    at the same id; None when too close to call (or past the last slice)."""
    above = np.cumsum(mass)
    j = int(np.searchsorted(above, target, side="left"))
    if j >= SLICES - 1 or abs(zmax) > 1e12:  # past the slices, or z too coarse for them
        return None
    near = np.flatnonzero(
        (z <= zmax - (j - 1) / SLICES_PER_NAT) & (z >= zmax - (j + 2) / SLICES_PER_NAT)
    )
    members = near[_slice_of(z[near] - zmax) == j]
    members = sorted_by_z(z, members)
    start = above[j - 1] if j else 0.0
    running = start + np.cumsum(np.exp(z[members] - zmax))
    m = int(np.searchsorted(running, target, side="left"))
    # Two orders of summing n nonnegative terms differ by at most 2 n 2**-53 of their total.
    slack = 4.0 * z.size * 2.0**-53 * above[-1]
    before = running[m - 1] if m else (start if j else -math.inf)
    if m >= running.size or running[m] - target <= slack or target - before <= slack:
        return None
    # Slices before j are exactly the ids above slice j's first member.
    return np.concatenate([np.flatnonzero(z > z[members[0]]), members[: m + 1]])


def _best(z: np.ndarray, ids: np.ndarray, key: int, bound: float) -> int:
    """Step 6 over `ids`, which hold i0 whose score is `bound`: the lowest id of the highest
    z + noise. Chunk by chunk, raising `bound` to the best score found: an id pruned by it
    scores strictly below a real score, so it can neither win nor tie."""
    winner, top = -1, -math.inf
    for start in range(0, ids.size, CHUNK):
        part = ids[start : start + CHUNK]
        zi = z[part]
        live = zi + NOISE_BOUND >= bound
        part, zi = part[live], zi[live]
        u = uniforms_np(key, part)
        # Safe while the ulp of bound is far below the 1e-3 margin in U_TAIL.
        if part.size > 64 and abs(bound) < 1e9:
            maybe = (zi >= bound - TAIL) | (u >= U_TAIL)
            part, zi, u = part[maybe], zi[maybe], u[maybe]
        if part.size == 0:
            continue
        scores = zi + gumbel_np(u)
        best = float(scores.max())
        i = int(part[scores == best].min())
        if best > top or (best == top and i < winner):
            winner, top = i, best
        bound = max(bound, best)
    return winner
