"""The MTP head against a small readable reference (there is no HF reference for it), and its
cached path (cells in pieces through a session) against the full forward."""

import json

import pytest
import torch
from safetensors.torch import load_file

from flashlane.models.loader import load_checkpoint
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from tests.models.mtp_reference import mtp_logits
from tests.oracle import GATE_CHECKPOINTS


def test_mtp_head_matches_reference(tiny_ckpt):
    cfg, model = load_checkpoint(tiny_ckpt, dtype=torch.float64)
    t = {
        k: v.double() if v.is_floating_point() else v
        for k, v in load_file(str(tiny_ckpt / "model.safetensors")).items()
    }
    raw = json.loads((tiny_ckpt / "config.json").read_text())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, cfg.vocab_size, (1, 25), generator=g)
    _, residual = model.forward_train(ids)
    nxt = torch.randint(3, cfg.vocab_size, (1, 25), generator=g)
    ours, _ = model.mtp_forward_train(residual, nxt)
    ref = mtp_logits(t, raw, residual[0], nxt[0])
    err = (ours[0].double() - ref).abs().max().item()
    assert err <= 1e-6 * ref.abs().max().item(), err


@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
def test_mtp_cells_in_pieces_equal_full(oracle_by_name, name):
    cfg, model = load_checkpoint(oracle_by_name(name), dtype=torch.float64)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, cfg.vocab_size, (1, 30), generator=g)
    _, residual = model.forward_train(ids)
    nxt = torch.randint(3, cfg.vocab_size, (1, 30), generator=g)
    full, _ = model.mtp_forward_train(residual, nxt)
    s = SessionState.empty(cfg, 64, torch.float64, torch.float64)
    outs, a = [], 0
    for n in (7, 1, 13, 9):
        rows = Rows.of([(s, nxt[0, a : a + n], a, False)], "cpu")
        logits, _ = model.mtp_cells(residual[0, a : a + n], rows.token_ids, rows)
        outs.append(logits)
        a += n
    torch.testing.assert_close(torch.cat(outs), full[0], rtol=1e-9, atol=1e-9)
