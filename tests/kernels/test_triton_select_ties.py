"""The indexer's ties through the Triton entry points the model calls: prefill pieces and
verify windows (select_mask), and the lone step (attend_sessions, sessions batched through a
table and one session alone). Scores are sums of ReLUs, so blocks tie at exactly 0.0 in real
prompts; the rule is that ties go to the lower block id, as the reference's stable sort ranks
them. Each test checks the kept blocks against the rule and the mask against the reference.

The ties are planted so that no summation order breaks them (the interpreter's dot is the
host BLAS's): index queries positive against negative block keys give every head a negative
product, so a score of exactly 0.0; small dyadic values (multiples of 1/8) make every product
and partial sum exact, so copies of a block key score the same bits, and twice a key twice
its score.

CPU: `TRITON_INTERPRET=1 python -m pytest -m triton tests/kernels/test_triton_select_ties.py`.
"""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.attention import reference as attn_ref
from flashlane.models.state import AttnCache, attn_table
from tests.kernels.triton_env import DEVICE, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.attention import triton as attn_tri  # noqa: E402
from flashlane.kernels.attention import triton_select, triton_select_spread  # noqa: E402
from flashlane.kernels.attention import triton_sessions as attn_ses  # noqa: E402

HI, DI, BLOCK, TOP, D = 2, 16, 4, 4, 32
# every block at 0.0; two blocks above 0.0 and the rest tied at it; one block above five
# copies of a key, so the cut falls inside the copies
PLANTS = ("all zero", "zeros at the cut", "copies at the cut")
COPIES, DOUBLE, HIGH = [1, 3, 5, 8, 11], 6, [9, 2]


@pytest.fixture(params=["whole", "chunks", "spread", "spread whole"], autouse=True)
def ranking(request, monkeypatch):
    """Rows ranked from one load of their scores, through the loops over chunks, by
    programs over their chunks (triton_select_spread.py), and by those with rows of up to 8
    blocks ranked whole by their first program."""
    spread = request.param.startswith("spread")
    if request.param != "whole":
        monkeypatch.setattr(triton_select, "WHOLE", 8 if request.param == "spread whole" else 2)
        monkeypatch.setattr(triton_select, "CHUNK", 16)
    monkeypatch.setattr(triton_select, "SPREAD", spread)
    if spread:  # programs of 16 blocks a row, masks 32 keys a step
        monkeypatch.setattr(triton_select, "SPREAD_KEYS", 0)
        monkeypatch.setattr(triton_select_spread, "MASK_KEYS", 32)


def planted(plant: str, b: int, t: int, nb: int, seed: int):
    """Index queries [B, T, HI, DI] and block keys [B, NB, DI] whose scores are `plant`, and
    each block's level (its score's rank class: equal levels are equal scores)."""
    gen = torch.Generator().manual_seed(seed)
    iq = torch.randint(1, 9, (b, t, HI, DI), generator=gen).float() / 8
    keys = -torch.randint(1, 9, (b, nb, DI), generator=gen).float() / 8
    levels = [0] * nb
    if plant == "zeros at the cut":
        for i in HIGH:  # above 0.0, in any order: fewer than TOP, so all kept
            keys[:, i] = -keys[:, i]
            levels[i] = 1
    elif plant == "copies at the cut":
        key = -keys[:, 0]
        keys[:, COPIES] = key[:, None]
        keys[:, DOUBLE] = 2 * key
        for i in COPIES:
            levels[i] = 1
        levels[DOUBLE] = 2
    return iq.to(DEVICE), keys.to(DEVICE), levels


def expected(levels: list[int], position: int) -> list[int]:
    """The rule: of the blocks complete at `position`, the TOP highest, ties to lower ids."""
    complete = min((position + 1) // BLOCK, len(levels))
    return sorted(sorted(range(complete), key=lambda i: (-levels[i], i))[:TOP])


def kept_blocks(mask_row: torch.Tensor, position: int, nb: int) -> list[int]:
    """The complete blocks a mask row [num_keys] allows whole."""
    complete = min((position + 1) // BLOCK, nb)
    return mask_row[: complete * BLOCK].view(complete, BLOCK).all(-1).nonzero()[:, 0].tolist()


def _check_masks(iq, keys, pos, levels):
    num_keys = keys.shape[1] * BLOCK
    got = attn_tri.select_mask(iq, keys, pos, num_keys, BLOCK, TOP)
    want = attn_ref.select_mask(iq, keys, pos, num_keys, BLOCK, TOP)
    assert torch.equal(got, want)
    for bi, ti in torch.cartesian_prod(*(torch.arange(n) for n in pos.shape)).tolist():
        p = int(pos[bi, ti])
        kept = kept_blocks(got[bi, ti].cpu(), p, keys.shape[1])
        assert kept == expected(levels, p), (bi, ti, p)


@pytest.mark.parametrize("plant", PLANTS)
def test_prefill_piece_ties_go_to_lower_blocks(plant):
    """A prompt piece: one sequence, rows at positions 64..133, up to 33 complete blocks."""
    start, t = 64, 70
    iq, keys, levels = planted(plant, 1, t, (start + t) // BLOCK, seed=1)
    _check_masks(iq, keys, torch.arange(start, start + t, device=DEVICE)[None], levels)


@pytest.mark.parametrize("plant", PLANTS)
def test_verify_window_ties_go_to_lower_blocks(plant):
    """Three verify windows of 5 rows at their own positions, over block keys padded to the
    longest with zeros (as the model pads them; never ranked: past every row's complete
    blocks)."""
    t, nb, starts = 5, 24, [40, 90, 21]
    iq, keys, levels = planted(plant, 3, t, nb, seed=2)
    for bi, s in enumerate(starts):
        keys[bi, (s + t) // BLOCK :] = 0.0
    pos = torch.stack([torch.arange(s, s + t) for s in starts]).to(DEVICE)
    _check_masks(iq, keys, pos, levels)


def _sessions(capacities, keys):
    """Attention caches of one kv head whose values are one-hot by block (v[key] = e_block),
    with the planted block keys."""
    gen = torch.Generator().manual_seed(5)
    out = []
    for i, cap in enumerate(capacities):
        v = torch.nn.functional.one_hot(torch.arange(cap) // BLOCK, D).float()[:, None]
        k, raw = torch.randn(cap, 1, D, generator=gen), torch.randn(cap, DI, generator=gen)
        out.append(AttnCache(k.to(DEVICE), v.to(DEVICE), raw.to(DEVICE),
                             keys[i, : cap // BLOCK].clone()))  # fmt: skip
    return out


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("plant", PLANTS)
def test_lone_step_ties_go_to_lower_blocks(plant, batched):
    """attend_sessions: three sessions through a table, or one alone (the per-session
    kernels). Queries of zero attend evenly to every key they may see and the values are
    one-hot by block, so a block's output is above 0 exactly when the step kept it. Each
    row sits inside a block: the key the step pools is not complete, so never ranked."""
    positions = [101, 57, 90] if batched else [101]
    capacities = [128, 64, 96][: len(positions)]
    b, nb = len(positions), max(capacities) // BLOCK
    iq, keys, levels = planted(plant, b, 1, nb, seed=3)
    gen = torch.Generator().manual_seed(6)
    pos = torch.tensor(positions)
    q = torch.zeros(b, 2, D)
    k, raw = torch.randn(b, 1, D, generator=gen), torch.randn(b, DI, generator=gen)
    v = torch.nn.functional.one_hot(pos // BLOCK, D).float()[:, None]
    cos, sin, weight = torch.ones(b, 8), torch.zeros(b, 8), torch.ones(DI)
    row = [x.to(DEVICE) for x in (q, k, v)] + [iq[:, 0], raw.to(DEVICE)]
    rest = [x.to(DEVICE) for x in (pos, cos, sin, weight)] + [1e-6, BLOCK, TOP, 1.0]
    ours = _sessions(capacities, keys)
    got = attn_ses.attend_sessions(*row, ours, *rest, table=attn_table(ours) if batched else None)
    want = attn_ref.attend_sessions(*row, _sessions(capacities, keys), *rest)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # count / n, summed otherwise
    for bi, p in enumerate(positions):
        complete = (p + 1) // BLOCK
        kept = (got[bi, 0, :complete] > 0).nonzero()[:, 0].tolist()
        assert kept == expected(levels, p), (bi, p)
