"""Each sibling's model on the Triton kernel set equals it on the torch references (fp32): a
prompt piece, then verify windows of 3 and 1 rows through a session. On a GPU, or on the CPU
under TRITON_INTERPRET=1 (about 30 s a family there: the interpreter runs every launch).

The prompt piece's chunked GDN is the reference's here: on a GPU with fla-core installed the
Triton set's chunk_gdn is fla's, whose fp32 dots are tf32 (1.1e-3 of the largest logit on
qwen3_5, H200, 2026-12-02; 0.83 on qwen3_5_moe, whose tiny router has a near tie that tf32
rounding of the chunk's inputs flips on the CPU too: benchmarks/sibling_kernel_bisect.py);
test_triton_mixers checks fla against the reference."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.kernels.triton_env import DEVICE, needs_triton
from tests.oracle import SIBLINGS

pytest.importorskip("triton")

from flashlane.kernels import REFERENCE
from flashlane.kernels.gpu import TRITON
from flashlane.models.flashnext import run_piece
from flashlane.models.loader import load_checkpoint
from flashlane.models.state import SessionState

pytestmark = needs_triton


@pytest.mark.parametrize("name", sorted(SIBLINGS))
def test_sibling_on_triton_kernels_equals_references(oracle_by_name, name):
    ids = torch.randint(3, 500, (12,), generator=torch.Generator().manual_seed(1))
    out = []
    ours = dataclasses.replace(TRITON, chunk_gdn=REFERENCE.chunk_gdn)
    for kernels in (REFERENCE, ours):
        cfg, model = load_checkpoint(oracle_by_name(name), torch.float32, DEVICE)
        model.use_kernels(kernels)
        s = SessionState.empty(cfg, 64, torch.float32, torch.float32, DEVICE)
        pieces = [(0, 8, False), (8, 11, True), (11, 12, True)]
        out.append(torch.cat([run_piece(model, s, ids[a:b], a, rec) for a, b, rec in pieces]))
    ref, got = out
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()
