"""A drawn row's log-probabilities (a request's `logprobs`), as shared rounds and lone steps
report them: float64 log_softmax of the row's fp32 logits, the `top` best ids and the drawn one."""

from __future__ import annotations

import math

import torch


def row_logprobs(logits: torch.Tensor, sampled: list[int], top: int) -> list[dict[int, float]]:
    """Per row of logits [n, V]: {id: logprob} for the `top` best ids and the drawn id."""
    lp = torch.log_softmax(logits.double(), dim=-1)
    out = []
    for row, tok in zip(lp, sampled):
        best = torch.topk(row, top).indices.tolist() if top else []
        # ids a grammar refuses (-inf) are no alternatives
        out.append({i: float(row[i]) for i in [*best, tok] if i == tok or row[i] > -math.inf})
    return out
