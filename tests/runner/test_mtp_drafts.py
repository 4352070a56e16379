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


def test_a_long_prompt_is_absorbed_in_pieces_as_it_is_kept(oracle_by_name):
    """A drafting stream's prompt cut in pieces has each piece's cells absorbed by the MTP
    head as it is kept (one forward of a 22k-token prompt's queue stalled every stream for
    20 s on the CPU; then a CATCH_UP_ROWS forward every 512 rows stalled them in turn); a
    prompt in one piece queues its cells for the first draft. The head's cache ends bit for
    bit as one absorb of the whole queue leaves it, and the drafts are the same."""
    cfg, model = load_checkpoint(oracle_by_name("tiny"), dtype=torch.float64)
    prompt = torch.randint(3, 500, (300,), generator=torch.Generator().manual_seed(4)).tolist()

    def run(rows: int):  # the prompt in pieces of `rows`
        session = SessionState.empty(cfg, 384, torch.float64, torch.float64)
        backend = ModelBackend(model, [session], max_rows=16, mtp_confidence=0.0)
        draws = Draws(GREEDY, 0, prompt, [])
        queued = []
        for a in range(0, len(prompt), rows):
            piece = tuple(prompt[a : a + rows])
            last = a + rows >= len(prompt)
            got = backend.verify([Window(0, 0, a, piece, draws, "prompt", last)])[0].sampled
            if last:
                draws.reply_ids.append(got[0])
            backend.keep({0: len(piece)})
            queued.append(backend.drafter.queued(0))
        drafts = backend.draft({0: 2})[0].tokens
        return session, queued, drafts

    whole, queued_whole, drafts_whole = run(320)
    pieces, queued_pieces, drafts_pieces = run(64)
    # each piece but the last absorbed as kept (its last row waits for the next piece)
    assert queued_whole == [300] and queued_pieces == [0, 0, 0, 0, 45]
    assert drafts_pieces == drafts_whole
    assert pieces.mtp_length == whole.mtp_length == 300
    # bit for bit as the CPU path promises (DESIGN.md section 1): its fp64 rounded to fp32
    # (the fp64 GEMM's last bits follow the row count on some hosts' BLAS: an AMD EPYC's)
    for a, b in zip(whole.mtp, pieces.mtp):
        n = whole.mtp_length
        assert torch.equal(a.k[:n].float(), b.k[:n].float())
        assert torch.equal(a.v[:n].float(), b.v[:n].float())
