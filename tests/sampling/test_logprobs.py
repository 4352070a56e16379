"""sampling/logprobs.row_logprobs: a drawn row's logprobs read in one transfer equal those read
id by id (the definition below), keys in the same order, -inf alternatives left out."""

import math

import numpy as np
import pytest
import torch

from flashlane.sampling.logprobs import row_logprobs
from tests.sampling.rows import random_row


def one_by_one(logits, sampled, top):
    lp = torch.log_softmax(logits.double(), dim=-1)
    out = []
    for row, tok in zip(lp, sampled):
        best = torch.topk(row, top).indices.tolist() if top else []
        out.append({i: float(row[i]) for i in [*best, tok] if i == tok or row[i] > -math.inf})
    return out


@pytest.mark.parametrize("top", [0, 1, 5, 20])
def test_one_transfer_equals_id_by_id(top):
    rng = np.random.default_rng(top)
    logits = torch.stack([random_row(rng, 700) for _ in range(6)])
    logits[1, :690] = -torch.inf  # fewer finite ids than `top`: -inf alternatives go
    logits[2] = 0.0  # every id tied
    sampled = [int(rng.integers(0, 700)) for _ in range(6)]
    sampled[1] = 3  # a drawn id whose logprob is -inf stays
    sampled[3] = int(logits[3].argmax())  # the drawn id among the best
    got, want = row_logprobs(logits, sampled, top), one_by_one(logits, sampled, top)
    assert got == want
    assert [list(g) for g in got] == [list(w) for w in want]  # the same key order
    assert got[1][3] == -math.inf and len(got[1]) == min(top, 10) + 1
    assert row_logprobs(logits[:0], [], top) == []
