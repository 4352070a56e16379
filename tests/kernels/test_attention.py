"""The QSA indexer's selection: top blocks, ties to the lower id, the dense region."""

import torch

from flashlane.kernels.attention.reference import attention, pool_blocks, select_mask


def test_dense_below_budget():
    iq = torch.randn(1, 5, 2, 8)
    keys = torch.randn(1, 2, 8)
    pos = torch.arange(5).view(1, 5)
    m = select_mask(iq, keys, pos, 5, block=4, top_blocks=2)
    assert torch.equal(m[0], torch.ones(5, 5, dtype=torch.bool).tril())


def test_ties_go_to_lower_block_and_tail_is_kept():
    # every block key is zero -> every score is 0: a tie across all complete blocks
    iq = torch.randn(1, 1, 2, 8)
    keys = torch.zeros(1, 5, 8)
    pos = torch.tensor([[21]])  # 5 complete blocks (0..19), tail 20, 21
    m = select_mask(iq, keys, pos, 22, block=4, top_blocks=2)[0, 0]
    want = torch.zeros(22, dtype=torch.bool)
    want[0:8] = True  # blocks 0 and 1 win the tie
    want[20:22] = True
    assert torch.equal(m, want)


def test_top_blocks_by_relu_score():
    iq = torch.ones(1, 1, 1, 4)
    keys = torch.tensor([[[1.0] * 4, [-5.0] * 4, [3.0] * 4, [2.0] * 4]])
    m = select_mask(iq, keys, torch.tensor([[17]]), 18, block=4, top_blocks=2)[0, 0]
    assert m[8:16].all() and not m[0:8].any() and m[16:18].all()


def test_pool_blocks_mean():
    raw = torch.arange(24.0).view(1, 6, 4)
    pooled = pool_blocks(raw, 4)
    assert pooled.shape == (1, 1, 4)
    assert torch.equal(pooled[0, 0], raw[0, :4].mean(0))


def test_attention_mask_respected():
    q, k, v = torch.randn(1, 3, 4, 8), torch.randn(1, 5, 2, 8), torch.randn(1, 5, 2, 8)
    mask = torch.zeros(1, 3, 5, dtype=torch.bool)
    mask[..., 2] = True
    out = attention(q, k, v, mask, 0.3)
    assert torch.allclose(out, v[:, 2:3].repeat_interleave(2, dim=2).expand(1, 3, 4, 8))


def test_select_mask_without_the_dense_check_is_the_same_mask():
    """dense_check=False (the lone driver: no host read) ranks every row, also rows that see
    all their complete blocks; block keys past the complete ones may hold anything."""
    g = torch.Generator().manual_seed(3)
    for last in (2, 7, 9, 11, 30, 47):  # 0 to 11 complete blocks of 4, top 3
        n = last + 1
        iq = torch.randn(1, 1, 2, 8, generator=g)
        keys = torch.randn(1, 16, 8, generator=g)  # 64 positions' worth of blocks
        keys[:, n // 4 :] = float("nan")  # incomplete or unwritten blocks: garbage
        pos = torch.tensor([[last]])
        want = select_mask(iq, keys[:, : n // 4], pos, n, block=4, top_blocks=3)
        got = select_mask(iq, keys, pos, 64, block=4, top_blocks=3, dense_check=False)
        assert torch.equal(got[..., :n], want) and not got[..., n:].any()


def test_attention_with_lengths_reads_nothing_past_them():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 1, 4, 8, generator=g)
    k, v = torch.randn(2, 20, 2, 8, generator=g), torch.randn(2, 20, 2, 8, generator=g)
    lengths = torch.tensor([13, 6])
    for b, n in enumerate(lengths.tolist()):
        k[b, n:], v[b, n:] = float("nan"), float("inf")
    mask = torch.arange(20).view(1, 1, -1) < lengths.view(-1, 1, 1)
    got = attention(q, k, v, mask, 0.3, lengths)
    for b, n in enumerate(lengths.tolist()):
        one = slice(b, b + 1)
        alone = attention(q[one], k[one, :n], v[one, :n], mask[one, :, :n], 0.3)
        # NaN or inf read past a length would show; the last bits are the host BLAS's (a
        # batch of 2 and a batch of 1 may take other paths: seen on an AMD EPYC host)
        assert torch.isfinite(got[one]).all()
        torch.testing.assert_close(got[one], alone, rtol=1e-6, atol=1e-6)
