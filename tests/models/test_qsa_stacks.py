"""QSA's stacked pieces (models/layers/qsa_attention.py): where several sessions' prompt
pieces, or their verify windows, attend in one call, the indexer's keys of the blocks they
complete are pooled in one launch for all (`_complete_all`), each block roped at its own
position. Every session's cache must then hold, bit for bit, what its piece written alone
leaves there (a block's pooled key is its four raw keys' alone)."""

import copy

import pytest
import torch

from flashlane.kernels import REFERENCE
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState

# each session's length before the round, and its piece's: blocks of 4 (flashnext-tiny's
# indexer_block), so the pieces complete no block, one or several, from starts inside one
STARTS = [6, 0, 3, 9, 2]
LENGTHS = [7, 10, 1, 2, 1]


def stacked_blocks_equal_alone(kernels, device: str, recurrent: bool) -> None:
    cfg, model = build_random(preset("flashnext-tiny"), torch.float32, device, 0)
    model.use_kernels(kernels)
    layer = next(i for i, kind in enumerate(cfg.layer_types) if kind != "linear")
    attn = model.layers[layer].self_attn
    assert cfg.indexer_block == 4
    gen = torch.Generator().manual_seed(1)
    lengths = [3] * len(STARTS) if recurrent else LENGTHS  # windows stack by width
    width, di = max(lengths), cfg.indexer_head_dim
    before = []
    for start in STARTS:  # each session's raw keys below its piece
        s = SessionState.empty(cfg, 64, torch.float32, torch.float32, device)
        s.attn[layer].index_keys[:start] = torch.randn(start, di, generator=gen).to(device)
        s.attn[layer].block_keys.zero_()  # (made whole by the prefill the test leaves out)
        s.length = start
        before.append(s)

    def randn(*shape):
        return torch.randn(len(STARTS), width, *shape, generator=gen).to(device)

    k, v = (randn(cfg.num_kv_heads, cfg.head_dim) for _ in "kv")
    raw = randn(di)

    def write(which: list[int]) -> list[SessionState]:
        sessions = copy.deepcopy(before)
        rows = Rows.of(
            [(sessions[i], [1] * lengths[i], STARTS[i], recurrent) for i in which], device
        )
        at = torch.tensor(which, device=device)
        got = attn._write_all(rows.pieces, k[at], v[at], raw[at], model.rotary, rows)
        for (_, end, blocks), i in zip(got, which):
            assert end == STARTS[i] + lengths[i] and blocks == end // 4
        return sessions

    together = write(list(range(len(STARTS))))
    for i, start in enumerate(STARTS):
        alone = write([i])[i]
        end, got, want = start + lengths[i], together[i].attn[layer], alone.attn[layer]
        assert torch.equal(got.block_keys, want.block_keys), i
        assert torch.equal(got.index_keys[:end], want.index_keys[:end]), i
        fresh = got.block_keys[start // 4 : end // 4]  # the blocks the piece completes
        assert all(b.any() for b in fresh), f"{i}: a block not pooled"
    assert sum(s.attn[layer].block_keys.any(-1).sum().item() for s in together) == sum(
        (start + n) // 4 - start // 4 for start, n in zip(STARTS, lengths)
    )


@pytest.mark.parametrize("recurrent", [False, True], ids=["prompt pieces", "verify windows"])
def test_blocks_pooled_together_equal_each_piece_alone(recurrent):
    stacked_blocks_equal_alone(REFERENCE, "cpu", recurrent)
