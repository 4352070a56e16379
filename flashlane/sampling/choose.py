"""The keyed draw of DESIGN.md section 5 on the CPU: penalties, greedy, filters, Gumbel argmax.

`draw_full` is the definition, step by step over the whole row: readable and slow, the spec.
`draw` and `draw_rows` return the same token faster (prune.py): they look only at the ids that
can matter and prove that the rest cannot. Both use numpy's float64 elementwise functions,
whose result for an element does not depend on its place in the array, so they agree bit for
bit; tests hold them to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from flashlane.sampling.keyed import gumbel_np, row_key, uniforms_np
from flashlane.sampling.prune import blocked_sum, pruned_choice, sorted_by_z, top_p_count
from flashlane.sampling.spec import (  # noqa: F401 (the samplers' names, here since issue 4)
    GREEDY_TEMPERATURE,
    DrawSpec,
    SampleError,
    bad_logit,
    is_plain_greedy,
    no_candidate,
)


def draw(logits: torch.Tensor, spec: DrawSpec) -> int:
    """The token for `spec.position` from fp32 logits [V] on any device."""
    return _draw_row(_to_numpy(logits), spec)


def draw_rows(logits: torch.Tensor, specs: Sequence[DrawSpec]) -> list[int | SampleError]:
    """One draw per row of fp32 logits [N, V]; a row's error comes back in its slot."""
    rows = _to_numpy(logits)
    out: list[int | SampleError] = []
    for row, spec in zip(rows, specs):
        try:
            out.append(_draw_row(row, spec))
        except SampleError as err:
            out.append(err)
    return out


def draw_full(logits: torch.Tensor, spec: DrawSpec) -> int:
    """DESIGN.md section 5 literally, over every id: the spec the fast paths are tested against."""
    p = spec.params
    l = adjusted(_to_numpy(logits), spec)  # step 0
    if p.temperature < GREEDY_TEMPERATURE:  # step 1
        return _greedy(l)
    z = l / p.temperature  # step 2
    zmax = z.max()
    if not np.isfinite(zmax):
        raise no_candidate(zmax)
    e = np.exp(z - zmax)  # -inf ids give 0
    order = sorted_by_z(z, np.flatnonzero(np.isfinite(z)))
    if p.top_k > 0:  # step 3
        order = order[: p.top_k]
    if p.top_p < 1.0:  # step 4
        dense = np.zeros(z.size)
        dense[order] = e[order]
        order = order[: top_p_count(e[order], blocked_sum(dense), p.top_p)]
    if p.min_p > 0.0:  # step 5
        order = order[e[order] >= p.min_p]
    key = row_key(spec.seed, spec.position)  # step 6
    scores = z[order] + gumbel_np(uniforms_np(key, order))
    return int(order[scores == scores.max()].min())


def adjusted(row: np.ndarray, spec: DrawSpec) -> np.ndarray:
    """Step 0: float64 logits [V] after logit_bias and the penalties. Raises SampleError for a
    NaN or +inf logit, or a bias/history id outside the vocabulary."""
    _check_logits(row)
    p = spec.params
    l = row.astype(np.float64)
    if p.logit_bias:
        ids = checked_ids(list(p.logit_bias), l.size, "logit_bias")
        l[ids] += np.array(list(p.logit_bias.values()), dtype=np.float64)
    if p.repetition_penalty != 1.0:
        seen = np.unique(checked_ids(seen_ids(spec), l.size, "a seen token"))
        v = l[seen]
        r = p.repetition_penalty
        with np.errstate(over="ignore"):  # a logit overflowing to +inf fails the row later
            l[seen] = np.where(v > 0, v / r, v * r)
    if p.presence_penalty != 0.0 or p.frequency_penalty != 0.0:
        reply = checked_ids(spec.reply_ids, l.size, "a reply token")
        ids, counts = np.unique(reply, return_counts=True)
        c = counts.astype(np.float64)
        l[ids] -= p.presence_penalty * (c > 0) + p.frequency_penalty * c
    return l


def seen_ids(spec: DrawSpec) -> np.ndarray:
    """The prompt and reply ids as one int64 array, for repetition_penalty."""
    parts = (np.asarray(spec.prompt_ids, dtype=np.int64), np.asarray(spec.reply_ids, np.int64))
    return np.concatenate([a.reshape(-1) for a in parts])


def greedy_on_device(
    logits: torch.Tensor, rows: Sequence[int], step: Callable | None = None
) -> dict[int, int]:
    """Plain greedy draws of `rows` of logits [M, V] where the logits lie (a GPU need not send
    them to the host): row -> id. torch's max returns the first maximal index, so ties go to
    the lower id. A row whose maximum is not finite (a NaN or +inf logit, or no finite
    candidate) is left out: draw_rows draws it and names its error. `step`: a kernel set's
    greedy_step (the first maximum, ties to the lower id, and the flag that it is finite with
    no NaN in the row, read as fp32: bf16 and fp32 widen exactly), one launch for the
    eight ops here; not for float64 logits, whose fp32 reading may tie what differs."""
    if not rows:
        return {}
    picked = logits if list(rows) == list(range(logits.shape[0])) else logits[list(rows)]
    if step is not None and logits.dtype != torch.float64:
        n = len(rows)
        out = torch.empty((n, 2), dtype=torch.long, device=logits.device)
        scratch = torch.empty((2, n), dtype=torch.long, device=logits.device)
        step(picked, out, scratch[0], scratch[1])  # scratch: the step's token and position
        back = out.cpu().tolist()
        return {r: i for r, (i, ok) in zip(rows, back) if ok}
    top, ids = picked.max(dim=1)
    back = torch.stack([ids, torch.isfinite(top).long()]).cpu().tolist()
    return {r: i for r, i, ok in zip(rows, back[0], back[1]) if ok}


def _draw_row(row: np.ndarray, spec: DrawSpec) -> int:
    p = spec.params
    l = adjusted(row, spec)
    if p.temperature < GREEDY_TEMPERATURE:
        return _greedy(l)
    z = np.divide(l, p.temperature, out=l)  # in place: each [V] temporary costs page faults
    if not np.isfinite(z.max()):
        raise no_candidate(z.max())
    return pruned_choice(z, p, row_key(spec.seed, spec.position))


def _to_numpy(logits: torch.Tensor) -> np.ndarray:
    t = logits.detach()
    if t.dtype not in (torch.float32, torch.float64):
        t = t.float()  # bf16/fp16 widen exactly
    return t.cpu().numpy()


def _check_logits(row: np.ndarray) -> None:
    top = row.max()  # NaN propagates through max, so one pass finds both problems
    if np.isnan(top):
        raise bad_logit("NaN", int(np.flatnonzero(np.isnan(row))[0]))
    if top == np.inf:
        raise bad_logit("+inf", int(np.flatnonzero(row == np.inf)[0]))


def checked_ids(ids: Sequence[int] | np.ndarray, vocab: int, what: str) -> np.ndarray:
    """`ids` as int64 [n]; SampleError naming `what` if one is outside the vocabulary."""
    arr = np.asarray(ids, dtype=np.int64).reshape(-1)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab):
        bad = int(arr[(arr < 0) | (arr >= vocab)][0])
        raise SampleError(f"{what} id {bad} is outside the vocabulary of {vocab} ids")
    return arr


def _greedy(l: np.ndarray) -> int:
    i = int(np.argmax(l))  # the first maximum: ties go to the lower id
    if not np.isfinite(l[i]):
        raise no_candidate(l[i])
    return i
