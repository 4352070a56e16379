"""A drawn row's log-probabilities (a request's `logprobs`), as shared rounds and lone steps
report them: float64 log_softmax of the row's fp32 logits, the `top` best ids and the drawn one."""

from __future__ import annotations

import math

import torch


def row_logprobs(logits: torch.Tensor, sampled: list[int], top: int) -> list[dict[int, float]]:
    """Per row of logits [n, V]: {id: logprob} for the `top` best ids and the drawn id."""
    n = len(sampled)
    if n == 0:
        return []
    drawn = torch.tensor(sampled, dtype=torch.long, device=logits.device)[:, None]
    ids, values = _picked(logits[:n], drawn, top)
    # one transfer for every row's ids and values (each float(row[i]) waited on the device)
    return [
        _kept(row_ids, row_values) for row_ids, row_values in zip(ids.tolist(), values.tolist())
    ]


def _picked(logits: torch.Tensor, drawn: torch.Tensor, top: int):
    """The ops both reports run on the device: per row of logits [n, V], ids [n, top + 1] (the
    `top` best by its float64 log_softmax, each row its own topk call so ties keep their
    order, then the drawn id of drawn [n, 1]) and their logprobs."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    ids = drawn
    if top:
        ids = torch.cat([torch.stack([torch.topk(row, top).indices for row in lp]), drawn], dim=1)
    return ids, lp.gather(1, ids)


def _kept(ids: list[int], values: list[float]) -> dict[int, float]:
    """{id: logprob} of a row's best ids and its drawn one (the last), without the -inf
    alternatives (ids a grammar refuses)."""
    tok = ids[-1]
    return {i: v for i, v in zip(ids, values) if i == tok or v > -math.inf}


MAX_TOP = 20  # SamplingParams.logprobs' largest


class StepLogprobs:
    """A lone step's logprobs, reported on the device (sampling/lone_draw.py): for each row that
    asks, row_logprobs' ops on the same row of the step's logits (log_softmax of its [1, V]
    fp32 reading widened to float64, its own topk, the gather at those ids and the drawn
    one), written as ids and float64 bits into `out` [B, 2 * WIDTH]. `post` copies out into
    a ring slot after the step, unawaited; `read` decodes a landed step's slot on the host.
    No host value is read in the step, so the driver's graph holds it with two steps in
    flight."""

    WIDTH = MAX_TOP + 1

    def __init__(self, b: int, device: torch.device, slots: int):
        self.rows: tuple[tuple[int, int], ...] = ()  # (row, top) of the rows that ask
        self.out = torch.zeros(b, 2 * self.WIDTH, dtype=torch.long, device=device)
        pinned = device.type == "cuda"
        self.ring = torch.zeros(slots, *self.out.shape, dtype=torch.long, pin_memory=pinned)

    def report(self, logits: torch.Tensor, tok: torch.Tensor) -> None:
        """Each asking row's logprobs from logits [B, V] and its drawn id in tok [B]."""
        w = self.WIDTH
        for i, top in self.rows:
            # fp32 first, as shared rounds hand row_logprobs (float64 logits on the CPU round)
            ids, values = _picked(logits[i : i + 1].float(), tok[i : i + 1, None], top)
            self.out[i, : top + 1] = ids[0]
            self.out[i, w : w + top + 1] = values[0].view(torch.long)

    def post(self, slot: int) -> None:
        if self.rows:
            self.ring[slot].copy_(self.out, non_blocking=True)

    def read(self, slot, rows: list[list[int]], skip=()) -> dict[int, dict[int, float]]:
        """The landed step's logprobs by row (rows [token, flag]: a row without a token has
        none), as row_logprobs gives them, from its ring slot (None: `out`, the last step's);
        not for the rows in `skip`."""
        w, data = self.WIDTH, self.out.cpu() if slot is None else self.ring[slot]
        out = {}
        for i, top in self.rows:
            if rows[i][1] and i not in skip:
                values = data[i, w : w + top + 1].view(torch.float64).tolist()
                out[i] = _kept(data[i, : top + 1].tolist(), values)
        return out
