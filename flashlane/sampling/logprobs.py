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
    lp = torch.log_softmax(logits.double(), dim=-1)
    ids = torch.tensor(sampled, dtype=torch.long, device=lp.device)[:, None]
    if top:  # each row's own topk call, as before (ties keep their order)
        best = torch.stack([torch.topk(row, top).indices for row in lp[:n]])
        ids = torch.cat([best, ids], dim=1)
    # one transfer for every row's ids and values (each float(row[i]) waited on the device)
    picked, values = ids.tolist(), lp[:n].gather(1, ids).tolist()
    out = []
    for row_ids, row_values in zip(picked, values):
        tok = row_ids[-1]
        # ids a grammar refuses (-inf) are no alternatives
        out.append({i: v for i, v in zip(row_ids, row_values) if i == tok or v > -math.inf})
    return out
