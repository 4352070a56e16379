"""A lone step's own small launches (kernels/rowwise/triton_rows.py) against the references:
the embedding rows repeated for the streams, the recorded residual rows with their counter
moved on (copies), and the rows' and blocks' rotary angles with the lengths (cos_sin's
arithmetic): bit for bit."""

from __future__ import annotations

import pytest
import torch

from flashlane.kernels.rowwise import reference as ref
from flashlane.kernels.rowwise import reference_step as step_ref
from tests.kernels.triton_env import DEVICE, DTYPES, needs_triton

pytestmark = needs_triton
pytest.importorskip("triton")

from flashlane.kernels.rowwise import triton_rows as trr  # noqa: E402


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b", [1, 3])
@pytest.mark.parametrize("copies", [1, 4])
def test_embed_rows_are_the_embedding_repeated(dtype, b, copies):
    g = torch.Generator().manual_seed(b * copies)
    weight = torch.randn(50, 1200, generator=g).to(dtype).to(DEVICE)
    tok = torch.tensor([7, 49, 0][:b], device=DEVICE)
    got = trr.embed_rows(weight, tok, copies)
    assert got.shape == (b, copies * 1200)
    assert torch.equal(got, ref.embed_rows(weight, tok, copies))
    assert torch.equal(got[:, :1200], weight[tok])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b", [1, 3])
def test_record_row_writes_row_k_and_moves_k_on(dtype, b):
    g = torch.Generator().manual_seed(b)
    width = 5000  # three blocks, the last one partial
    rows = torch.zeros(4, b, width, dtype=dtype, device=DEVICE)
    want_rows = rows.clone()
    k, want_k = torch.tensor([1], device=DEVICE), torch.tensor([1], device=DEVICE)
    for step in range(3):  # k = 1, 2, 3: each launch reads the k the one before left
        r = torch.randn(b, width, generator=g).to(dtype).to(DEVICE)
        trr.record_row(rows, k, r)
        step_ref.record_row(want_rows, want_k, r)
        assert int(k) == 2 + step and torch.equal(k, want_k)
        assert torch.equal(rows, want_rows)
    assert torch.equal(rows[0], torch.zeros_like(rows[0]))  # never written


@pytest.mark.parametrize("b", [1, 3])
def test_record_row_posts_the_verdict_in_the_slot_of_the_k_it_leaves(b):
    pinned = DEVICE == "cuda"
    if pinned and not trr.posts_to_pinned(torch.device(DEVICE)):
        pytest.skip("this GPU's launcher does not store into pinned memory")
    rows = torch.zeros(6, b, 3000, device=DEVICE)
    k = torch.tensor([0], device=DEVICE)
    ring = torch.full((4, b, 2), -1, dtype=torch.long, pin_memory=pinned)
    for step in range(6):  # slots 0, 1, 2, 3, 0, 1
        out = torch.arange(2 * b, device=DEVICE).view(b, 2) + 100 * step
        r = torch.full((b, 3000), float(step), device=DEVICE)
        trr.record_row(rows, k, r, out, ring)
        if pinned:
            torch.cuda.synchronize()
        assert int(k) == step + 1 and torch.equal(rows[step], r)
        assert torch.equal(ring[step % 4], out.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
def test_step_angles_are_cos_sin_twice_and_the_lengths(dtype):
    from flashlane.kernels.rowwise import triton_rope as trope

    pos = torch.tensor([0, 5, 63, 64, 1000, 131071], device=DEVICE)
    inv = 1.0 / (1e7 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)).to(DEVICE)
    got = trr.step_angles(pos, inv, dtype, 64)
    want = (*trope.cos_sin(pos, inv, dtype), *trope.cos_sin(pos, inv, dtype, 64), pos + 1)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)
    for g, w in zip(got, step_ref.step_angles(pos.cpu(), inv.cpu(), dtype, 64), strict=True):
        tol = 2e-6 if dtype == torch.float32 else 1e-2
        torch.testing.assert_close(g.cpu(), w, rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_step_angles_of_windows_write_each_rows_position(dtype):
    """window: positions [B] are the windows' first, row b*T + j at positions[b] + j (a
    drafted step's rows), written into window; the angles and lengths are the plain ones of
    those positions, bitwise; the reference likewise."""
    pos = torch.tensor([0, 62, 1000], device=DEVICE)
    inv = 1.0 / (1e7 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64)).to(DEVICE)
    rows = torch.tensor([0, 1, 2, 62, 63, 64, 1000, 1001, 1002], device=DEVICE)
    window = torch.full((9,), -1, device=DEVICE)
    got = trr.step_angles(pos, inv, dtype, 64, window=window)
    assert torch.equal(window, rows)
    for g, w in zip(got, trr.step_angles(rows, inv, dtype, 64), strict=True):
        assert torch.equal(g, w)
    want_window = torch.full((9,), -1)
    want = step_ref.step_angles(pos.cpu(), inv.cpu(), dtype, 64, window=want_window)
    assert torch.equal(want_window, rows.cpu())
    for w, plain in zip(want, step_ref.step_angles(rows.cpu(), inv.cpu(), dtype, 64)):
        assert torch.equal(w, plain)
    with pytest.raises(ValueError, match="window"):
        trr.step_angles(pos, inv, dtype, 64, window=window[:8])
    # first: an MTP chain's cell d drafts on, one row a session at positions + d
    cell = torch.full((3,), -1, device=DEVICE)
    got = trr.step_angles(pos, inv, dtype, 64, window=cell, first=2)
    assert torch.equal(cell, pos + 2)
    for g, w in zip(got, trr.step_angles(pos + 2, inv, dtype, 64), strict=True):
        assert torch.equal(g, w)
    want_cell = torch.full((3,), -1)
    step_ref.step_angles(pos.cpu(), inv.cpu(), dtype, 64, window=want_cell, first=2)
    assert torch.equal(want_cell, pos.cpu() + 2)


@pytest.mark.parametrize("b", [1, 16])
def test_post_ring_stores_the_verdict_in_slot_k_minus_one(b):
    """On a GPU the ring is pinned host memory the kernel stores into (where the probe says
    it can); under the interpreter, a CPU tensor."""
    pinned = DEVICE == "cuda"
    if pinned and not trr.posts_to_pinned(torch.device(DEVICE)):
        pytest.skip("this GPU's launcher does not store into pinned memory")
    for k in (1, 4, 6):
        ring = torch.full((4, b, 2), -1, dtype=torch.long, pin_memory=pinned)
        out = torch.arange(2 * b, device=DEVICE).view(b, 2) + 100 * k
        trr.post_ring(out, ring, torch.tensor([k], device=DEVICE))
        if pinned:
            torch.cuda.synchronize()
        want = torch.full((4, b, 2), -1, dtype=torch.long)
        step_ref.post_ring(out.cpu(), want, torch.tensor([k]))
        assert torch.equal(ring, want) and torch.equal(ring[(k - 1) % 4], out.cpu())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b", [1, 3])
def test_embed_rows_with_the_first_norm_is_rms_norm_of_the_rows(dtype, b):
    from flashlane.kernels.norms import triton as trn

    g = torch.Generator().manual_seed(b)
    h, copies = 96, 4
    weight = torch.randn(50, h, generator=g).to(dtype).to(DEVICE)
    norm_w = (0.1 * torch.randn(copies * h, generator=g)).to(dtype).to(DEVICE)
    tok = torch.tensor([7, 49, 0][:b], device=DEVICE)
    r, xn = trr.embed_rows(weight, tok, copies, (norm_w, 1e-6))
    assert torch.equal(r, trr.embed_rows(weight, tok, copies))
    assert torch.equal(xn, trn.rms_norm(r, norm_w, 1e-6, h))
    want = ref.embed_rows(weight.cpu(), tok.cpu(), copies, (norm_w.cpu(), 1e-6))
    torch.testing.assert_close(xn.cpu().float(), want[1].float(), rtol=2e-2, atol=2e-2)
    # the ids read where they lie: a column of a drafted step's drafts [B, K]
    drafts = torch.full((b, 3), 5, device=DEVICE)
    drafts[:, 1] = tok
    r2, xn2 = trr.embed_rows(weight, drafts[:, 1], copies, (norm_w, 1e-6))
    assert torch.equal(r2, r) and torch.equal(xn2, xn)
    # one copy: the MTP cell's embedding norm (pre_fc_norm_embedding) is rms_norm alone
    _, one = trr.embed_rows(weight, drafts[:, 1], 1, (norm_w[:h], 1e-6))
    assert torch.equal(one, trn.rms_norm(weight[tok], norm_w[:h], 1e-6))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ple_add_is_torchs_two_adds(dtype):
    from flashlane.kernels.rowwise import triton_ple as trp

    g = torch.Generator().manual_seed(3)
    r, gated, y = (torch.randn(2, 1, 3000, generator=g).to(dtype).to(DEVICE) for _ in range(3))
    assert torch.equal(trp.ple_add(r, gated, y), r + (gated + y))


@pytest.mark.parametrize("b", [1, 2])
def test_push_history_moves_the_ids_on_in_place(b):
    from flashlane.kernels.rowwise import triton_ple as trp

    ids = torch.tensor([[5, 6], [7, 8]][:b], device=DEVICE)
    want_ids = ids.clone()
    tok = torch.tensor([9, 10][:b], device=DEVICE)
    hist = trp.push_history(ids, tok)
    want = ref.push_history(want_ids, tok)
    assert torch.equal(hist, want) and torch.equal(ids, want_ids)
    assert ids[0].tolist() == [6, 9] and hist[0].tolist() == [5, 6, 9]
