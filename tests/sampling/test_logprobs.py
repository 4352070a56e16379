"""sampling/logprobs.row_logprobs: a drawn row's logprobs read in one transfer equal those read
id by id (the definition below), keys in the same order, -inf alternatives left out."""

import math

import numpy as np
import pytest
import torch

from flashlane.sampling.logprobs import StepLogprobs, row_logprobs
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_step_report_equals_row_logprobs(dtype):
    """StepLogprobs (a lone step's report on the device) read from its ring slot gives each
    asking row what row_logprobs gives for the row's fp32 reading and drawn id; a row
    without a token, a skipped row and a row that does not ask get none."""
    rng = np.random.default_rng(7)
    logits = torch.stack([random_row(rng, 700) for _ in range(5)]).to(dtype)
    if dtype == torch.float64:  # the CPU's rounds: finer than fp32
        logits += torch.from_numpy(rng.normal(size=(5, 700))) * 1e-9
    logits[1, :690] = -torch.inf
    tok = torch.tensor([int(t) for t in rng.integers(0, 700, 5)])
    tok[1] = 3  # a drawn id whose logprob is -inf
    step = StepLogprobs(5, torch.device("cpu"), slots=3)
    step.rows = ((0, 20), (1, 5), (2, 0), (3, 2))  # row 4 does not ask
    step.report(logits, tok)
    step.post(2)
    step.out.zero_()  # the next step's report: the slot keeps this one
    rows = [[int(t), 1] for t in tok]
    rows[3][1] = 0  # no token: no logprobs
    got = step.read(2, rows, skip=(2,))
    want = {i: row_logprobs(logits[i : i + 1].float(), [int(tok[i])], top)[0]
            for i, top in step.rows if i in (0, 1)}  # fmt: skip
    assert got == want and list(got[0]) == list(want[0])
    assert len(got[0]) == 21 and 3 in got[1]
