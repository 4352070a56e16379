"""The keyed draw of adjusted rows (logit_bias, penalties) inside a lone step, on the device.

The fused kernels (triton_draw) order candidates by their fp32 bits, where DESIGN's step 0
adjusts the logits in float64, so they leave such rows (kinds.OTHER) UNSETTLED.
`AdjustedRows` draws them right after the kernels, in the same step: step 0 to 6 over every id
of each row in float64 torch ops of fixed shapes, with each row's reply counts and prompt ids
kept on the device, where the step adds the token it lands. No host value is read, so the lone
driver's CUDA graph holds the step and keeps two steps in flight.

The ops are choose.adjusted's and gpu._draw_pooled's, element for element: the bias added,
the repetition penalty on the seen ids, presence and frequency subtracted where the count is
positive, z = l / T, min_p against exp(z - zmax), Gumbel noise keyed by (seed, position, id),
the first best score. Pooling is only a shortcut there, so scoring every finite id gives the
same winner; a top_k keeps the first top_k ids in the candidate order (z descending, ties to
the lower id). Greedy rows take the first maximum of the adjusted logits.

It takes greedy, plain, min_p and top_k rows (top_k up to MAX_K). A top_p row stays with the
host (its cut needs a proof of the sum's rounding, gpu._top_p_keep), as does a row whose
bias or penalties could overflow float64 (`takes`); KeyedDraw.settle draws those.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from flashlane.sampling.keyed import (
    gumbel_torch,
    row_keys_torch,
    splitmix64,
    splitmix64_torch,
    uniforms_torch,
)
from flashlane.sampling.kinds import OTHER, row_kind
from flashlane.sampling.spec import GREEDY_TEMPERATURE, INF_AT, NAN_AT, NO_CANDIDATE, DrawSpec
from flashlane.sampling.vocab_rows import BIAS_IDS, VocabRows

LIMIT = 1e30  # |bias|, |penalties| and 1/repetition_penalty up to this keep fp32 logits finite
MAX_K = 4096  # larger top_k rows stay with the host (torch.topk's cost grows with k)
GROUP = 16  # rows drawn together: a few float64 [GROUP, V] temporaries at a time
F64 = torch.float64


def takes(spec: DrawSpec, vocab: int) -> bool:
    """Whether a step draws this row here: an OTHER row without top_p, its top_k at most
    MAX_K, its values within LIMIT and its bias ids inside the vocabulary, BIAS_IDS at most."""
    p = spec.params
    if row_kind(p, vocab) != OTHER or p.top_p < 1.0 or MAX_K < p.top_k < vocab:
        return False
    bias = p.logit_bias or {}
    values = [p.presence_penalty, p.frequency_penalty, *bias.values()]
    rp = p.repetition_penalty
    return (
        all(abs(v) <= LIMIT for v in values)
        and 1 / LIMIT <= rp <= LIMIT
        and all(0 <= t < vocab for t in bias)
        and len(bias) <= BIAS_IDS
    )


class AdjustedRows:
    """Up to B rows of a lone step drawn here (module docstring); buffers made at the first
    load that needs them and kept (graphs hold their addresses)."""

    def __init__(self, b: int, vocab: int, device: torch.device, rows: VocabRows | None = None):
        """rows: the [B, V] buffers shared with the driver's other sizes (a pool of its own
        if None)."""
        self.b, self.vocab, self.device = b, vocab, device
        self.pool = rows if rows is not None else VocabRows(b, vocab, device)
        self.n, self.any_bias, self.any_seen, self.max_k = 0, False, False, 0
        self.idx = torch.zeros(b, dtype=torch.long, device=device)
        # per row: temperature (1 for greedy rows), presence, frequency, repetition, min_p,
        # top_k (0: none), greedy (1.0 or 0.0)
        self.cols = torch.zeros(b, 7, dtype=F64, device=device)
        self.seeds = torch.zeros(b, dtype=torch.long, device=device)  # splitmix64(seed)
        self.ids = torch.arange(vocab, device=device)
        self.counts: torch.Tensor | None = None  # [B, V] int32: each id's count in the reply
        self.seen: torch.Tensor | None = None  # [B, V] bool: the prompt's ids
        self.bias: tuple | None = None  # ([B, BIAS_IDS] ids, [B, BIAS_IDS] float64 values)

    @property
    def key(self) -> tuple:
        """What a graph of the step is compiled for: the rows' count and which ops run."""
        return (self.n, self.any_bias, self.any_seen, self.max_k) if self.n else ()

    def moved(self) -> tuple[torch.Tensor, ...]:
        """What a step moves on besides the driver's inputs: the loaded rows' counts (a view;
        a warm-up step, lone_buffers.warm_up, puts it back)."""
        return (self.counts[: self.n],) if self.n else ()

    def load(self, specs: Sequence[DrawSpec], rows: Sequence[int]) -> list[int]:
        """Of `rows` (places in the step) with their specs, whose reply lists hold every
        landed token, those this draws (`takes`, and every history id inside the vocabulary):
        their counts, prompt ids and bias go to the device now, outside any step. Returns
        them; the rest stay with the host."""
        v = self.vocab
        took, specs = _taken(specs, rows, v)
        n = self.n = len(took)
        if not n:
            return []
        ps = [s.params for s, _, _ in specs]
        self.any_bias = any(p.logit_bias for p in ps)
        self.any_seen = any(p.repetition_penalty != 1.0 for p in ps)
        self.max_k = max((p.top_k for p in ps if 0 < p.top_k < v), default=0)
        greedy = [p.temperature < GREEDY_TEMPERATURE for p in ps]
        cols = [
            (1.0 if g else p.temperature, p.presence_penalty, p.frequency_penalty,
             p.repetition_penalty, p.min_p, p.top_k if 0 < p.top_k < v else 0, float(g))
            for p, g in zip(ps, greedy)
        ]  # fmt: skip
        self.idx[:n].copy_(torch.tensor(took, dtype=torch.long))
        self.cols[:n].copy_(torch.tensor(cols, dtype=F64))
        # the seed's half of row_key (keyed.py): each step hashes in its position
        self.seeds[:n].copy_(row_keys_torch([splitmix64(s.seed) for s, _, _ in specs], "cpu"))
        self.counts = self._scatter("counts", [r for _, r, _ in specs])
        if self.any_seen:
            self.seen = self._scatter("seen", [p for _, _, p in specs])
        if self.any_bias:  # each row's ids and values, then -0.0 (adds nothing) at other ids
            # (distinct ones: a GPU's scatter_add adds with atomics, so no address waits)
            ids = np.tile(np.arange(BIAS_IDS, dtype=np.int64) % v, (n, 1))
            values = np.full((n, BIAS_IDS), -0.0)
            for i, p in enumerate(ps):
                row = p.logit_bias or {}
                ids[i, : len(row)], values[i, : len(row)] = list(row), list(row.values())
            self.bias = (self.pool.take("bias_ids", self.b), self.pool.take("bias_values", self.b))
            self.bias[0][:n].copy_(torch.from_numpy(ids))
            self.bias[1][:n].copy_(torch.from_numpy(values))
        return took

    def _scatter(self, name: str, ids: list[np.ndarray]) -> torch.Tensor:
        """The pool's buffer `name` [B, V] with rows :n cleared, then each row i's `ids`
        counted (int32) or marked (bool)."""
        buf = self.pool.take(name, self.b)
        dtype = buf.dtype
        n = len(ids)
        buf[:n].zero_()
        flat = np.concatenate([a + i * self.vocab for i, a in enumerate(ids)])
        at = torch.from_numpy(flat).to(self.device)
        view = buf.view(-1)
        if dtype == torch.int32:
            view.index_add_(0, at, torch.ones_like(at, dtype=dtype))
        else:
            view[at] = True
        return buf

    def __call__(
        self, logits: torch.Tensor, out: torch.Tensor, tok: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """The loaded rows' draws from logits [B, V] at positions [B] (the ones drawn): into
        out [B, 2] (token or failure code, flag) and tok [B] (0 for a failed row), and each
        drawn token into its row's counts."""
        for a in range(0, self.n, GROUP):
            rows = slice(a, min(self.n, a + GROUP))
            idx, counts = self.idx[rows], self.counts[rows]
            x = logits.index_select(0, idx)
            code = self._draw(rows, x, counts, positions.index_select(0, idx))
            v = self.vocab
            nan_at = torch.where(torch.isnan(x), self.ids, v).amin(1)
            inf_at = torch.where(torch.isposinf(x), self.ids, v).amin(1)
            code = torch.where(inf_at < v, INF_AT - 2 * inf_at, code)
            code = torch.where(nan_at < v, NAN_AT - 2 * nan_at, code)
            ok = code >= 0
            token = torch.where(ok, code, 0)
            out[idx, 0] = code
            out[idx, 1] = ok.long()
            tok[idx] = token
            counts.scatter_add_(1, token[:, None], ok.int()[:, None])

    def _draw(self, rows: slice, x: torch.Tensor, counts: torch.Tensor, at: torch.Tensor):
        """Each of `rows`' token, or NO_CANDIDATE where no adjusted logit is finite."""
        v = x.shape[1]
        temp, pres, freq, rp, min_p, top_k, greedy = self.cols[rows, :, None].unbind(1)
        l = x.to(F64)  # bf16 and fp32 widen exactly
        if self.any_bias:  # a row's bias added at its ids alone, as choose.adjusted does
            l = l.scatter_add(1, self.bias[0][rows], self.bias[1][rows])
        if self.any_seen:
            seen = self.seen[rows] | (counts > 0)
            l = torch.where(seen, torch.where(l > 0, l / rp, l * rp), l)
        l = torch.where(counts > 0, l - (pres + freq * counts), l)
        z = l / temp
        top = torch.where(greedy > 0, l, z).amax(1, keepdim=True)
        zmax = torch.where(torch.isfinite(top), top, 0.0)
        keep = z > -torch.inf
        if self.max_k:
            keep = self._top_k(z, keep, top_k)
        keep &= torch.exp(z - zmax) >= min_p
        key = splitmix64_torch(self.seeds[rows] ^ at)
        noise = gumbel_torch(uniforms_torch(key[:, None], self.ids[None, :]))
        scores = torch.where(greedy > 0, l, torch.where(keep, z + noise, -torch.inf))
        best = scores.amax(1, keepdim=True)
        token = torch.where(scores == best, self.ids, v).amin(1)
        return torch.where(torch.isfinite(top[:, 0]), token, NO_CANDIDATE)

    def _top_k(self, z: torch.Tensor, keep: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
        """keep narrowed to each top_k row's first top_k candidates: every finite z above the
        k-th largest, then the lowest ids equal to it."""
        k = top_k.long()
        kth = torch.topk(z, self.max_k, dim=1).values.gather(1, (k - 1).clamp(min=0))
        above = keep & (z > kth)
        tied = keep & (z == kth)
        room = k - above.sum(1, keepdim=True)
        narrowed = above | (tied & (torch.cumsum(tied, 1) <= room))
        return torch.where(k > 0, narrowed, keep)


def _taken(specs, rows, vocab: int) -> tuple[list[int], list[tuple]]:
    """The rows `takes` with every reply id (and prompt id, for a repetition penalty) inside
    the vocabulary, and for each its (spec, reply ids, prompt ids) as int64 arrays."""
    took, kept = [], []
    for spec, row in zip(specs, rows):
        if not takes(spec, vocab):
            continue
        reply = np.asarray(spec.reply_ids, dtype=np.int64).reshape(-1)
        seen = spec.params.repetition_penalty != 1.0
        prompt = np.asarray(spec.prompt_ids if seen else (), dtype=np.int64).reshape(-1)
        both = np.concatenate([reply, prompt])
        if both.size and (both.min() < 0 or both.max() >= vocab):
            continue  # the host names the id in the row's error
        took.append(row)
        kept.append((spec, reply, prompt))
    return took, kept
