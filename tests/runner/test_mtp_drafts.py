"""The backend's MTP drafts are the head's own greedy choices: after a prompt, the first
draft is the argmax of the cell that pairs the prompt's last row with the first reply token,
the second the argmax of the chained cell (the head's output fed back with the first draft),
for Flash Next's checkpoint and each sibling's."""

import pytest
import torch

from flashlane.lanes.records import Draws, Window
from flashlane.models.loader import load_checkpoint
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.backend import ModelBackend
from tests.oracle import GATE_CHECKPOINTS

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
def test_drafts_are_the_heads_greedy_chain(oracle_by_name, name):
    cfg, model = load_checkpoint(oracle_by_name(name), dtype=torch.float64)
    prompt = torch.randint(3, 500, (37,), generator=torch.Generator().manual_seed(2)).tolist()
    session = SessionState.empty(cfg, 128, torch.float64, torch.float64)
    # confidence 0: the chain goes on whatever the random head's probabilities
    backend = ModelBackend(model, [session], max_rows=16, mtp_confidence=0.0)
    draws = Draws(GREEDY, 0, prompt, [])
    first = backend.verify([Window(0, 0, 0, tuple(prompt), draws, "prompt", True)])[0].sampled
    draws.reply_ids.append(first[0])  # the lane core appends the pending token
    backend.keep({0: len(prompt)})
    got = backend.draft({0: 2})[0].tokens

    ref = SessionState.empty(cfg, 128, torch.float64, torch.float64)
    _, hidden = model.forward_train(torch.tensor([prompt]))
    rows = Rows.of([(ref, [*prompt[1:], first[0]], 0, False)], "cpu")
    logits, out = model.mtp_cells(hidden[0], rows.token_ids, rows)
    d1 = int(logits[-1].argmax())
    rows = Rows.of([(ref, [d1], len(prompt), False)], "cpu")
    logits, _ = model.mtp_cells(out[-1:], rows.token_ids, rows)
    assert got == [d1, int(logits[-1].argmax())]
