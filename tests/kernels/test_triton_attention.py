"""Triton QSA attention and indexer kernels vs the torch references, and their row invariance.

A row's output must be bitwise the same whatever the call's width T, the row's offset in it,
and whatever the other rows and batch entries hold. On the CPU the interpreter runs small
shapes in fp32; on a GPU the model's (24 q heads over 2 kv heads of 256) in fp32 and bf16.
Where a row moves inside a tile (another width or offset) its dots may sum in another order
under the interpreter (the host BLAS's), so those claims are bitwise on the GPU and within
DOT_TOL under the interpreter (triton_env's assert_dot_equal); where a row keeps its place
(another batch entry, skipped or bounded blocks) they are bitwise everywhere.
Tolerances against the fp32 reference: fp32 1e-5 (the reductions run in another order);
bf16 2e-2 (outputs, and the probabilities for the tensor cores, rounded to bf16).
(The GDN kernels: test_triton_mixers.py.)
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.triton_env import (
    DEVICE,
    DTYPES,
    HAS_CUDA,
    assert_dot_equal,
    exact_in_interpreter,
    needs_triton,
)

pytest.importorskip("triton")

from flashlane.kernels.attention import reference as attn_ref
from flashlane.kernels.attention import triton as attn_tri

pytestmark = needs_triton

# (Hq, Hkv, D)
ATTN_SHAPE = (24, 2, 256) if HAS_CUDA else (6, 2, 32)


def tols(dtype):
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 2e-2, "atol": 2e-2}


# ---------------------------------------------------------------------------- attention


def attn_inputs(b, t, l, dtype, seed=0):
    hq, hkv, d = ATTN_SHAPE
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hq, d, generator=gen)
    k = torch.randn(b, l, hkv, d, generator=gen)
    v = torch.randn(b, l, hkv, d, generator=gen)
    return [x.to(DEVICE, dtype) for x in (q, k, v)]


def causal_mask(b, t, l):
    """Queries at positions l - t .. l - 1 over keys 0 .. l - 1."""
    pos = torch.arange(l - t, l, device=DEVICE).view(1, t, 1)
    return (torch.arange(l, device=DEVICE).view(1, 1, l) <= pos).expand(b, t, l).contiguous()


def sparse_mask(b, t, l, seed=0):
    """Causal with random holes, and whole 64-key blocks cut for every other row."""
    gen = torch.Generator().manual_seed(seed)
    m = causal_mask(b, t, l).clone()
    m &= (torch.rand(b, t, l, generator=gen) < 0.6).to(DEVICE)
    m[:, ::2, 64:128] = False
    if l > 200:
        m[:, 1::3, :200] = False  # rows that see nothing in the first key blocks
    pos = torch.arange(l - t, l, device=DEVICE)
    m[:, torch.arange(t, device=DEVICE), pos] = True  # the diagonal is always allowed
    return m


def scale():
    return ATTN_SHAPE[2] ** -0.5


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3, 16, 70])
@pytest.mark.parametrize("l", [150, 257])
@pytest.mark.parametrize("kind", ["causal", "sparse"])
def test_attention_matches_reference(kind, l, t, dtype):
    b = 2
    q, k, v = attn_inputs(b, t, l, dtype, seed=l + t)
    mask = causal_mask(b, t, l) if kind == "causal" else sparse_mask(b, t, l, seed=t)
    o = attn_tri.attention(q, k, v, mask, scale())
    o_ref = attn_ref.attention(q.float(), k.float(), v.float(), mask, scale())
    assert o.dtype == dtype and o.shape == q.shape
    torch.testing.assert_close(o.float(), o_ref, **tols(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["causal", "sparse"])
def test_attention_row_invariance(kind, dtype):
    """A row is bitwise the same in windows of any width and offset, alone or in a batch."""
    past, t, b = 180, 16, 3
    l = past + t
    q, k, v = attn_inputs(b, t, l, dtype, seed=11)
    mask = causal_mask(b, t, l) if kind == "causal" else sparse_mask(b, t, l, seed=5)
    full = attn_tri.attention(q, k, v, mask, scale())
    # windows of rows [a, a + w) see the keys up to their last row only
    for a, w in ((0, 1), (0, 5), (3, 1), (3, 9), (15, 1), (7, 9)):
        n = past + a + w
        part = attn_tri.attention(
            q[:, a : a + w], k[:, :n], v[:, :n], mask[:, a : a + w, :n], scale()
        )
        assert_dot_equal(part, full[:, a : a + w], (a, w))
    # each stream alone equals the same stream in the batch
    for i in range(b):
        alone = attn_tri.attention(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], mask[i : i + 1], scale()
        )
        assert torch.equal(alone, full[i : i + 1])
    # a shorter stream padded with garbage keys (masked out) in a batch with longer ones
    short = 100
    alone = attn_tri.attention(q[:1], k[:1, :short], v[:1, :short], mask[:1, :, :short], scale())
    padded_mask = mask.clone()
    padded_mask[0, :, short:] = False
    kk, vv = k.clone(), v.clone()
    kk[0, short:] = 1e4
    vv[0, short:] = -1e4
    both = attn_tri.attention(q, kk, vv, padded_mask, scale())
    assert torch.equal(both[:1], alone)
    assert torch.equal(both[1:], full[1:])


def _positions(b, t, l):
    return torch.arange(l - t, l, device=DEVICE).expand(b, t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["causal", "sparse"])
def test_attention_positions_and_skip_keep_the_bits(kind, dtype):
    """Ending each tile's walk at its last row's position, and loading the blocks no row of
    the tile may see (SKIP off), change no bit of any row; the rows stay invariant."""
    past, t, b = 180, 70, 2
    l = past + t
    q, k, v = attn_inputs(b, t, l, dtype, seed=3)
    mask = causal_mask(b, t, l) if kind == "causal" else sparse_mask(b, t, l, seed=9)
    pos = _positions(b, t, l)
    plain = attn_tri.attention(q, k, v, mask, scale())
    bound = attn_tri.attention(q, k, v, mask, scale(), positions=pos)
    assert torch.equal(bound, plain)
    cfg = attn_tri.CONFIGS[k.dtype]
    for skip in (True, False):
        cfg = (*cfg[:5], skip)
        full = attn_tri.attention(q, k, v, mask, scale(), positions=pos, config=cfg)
        assert torch.equal(full, plain), skip
        for a, w in ((0, 1), (5, 3), (69, 1), (10, 40)):
            n = past + a + w
            part = attn_tri.attention(
                q[:, a : a + w],
                k[:, :n],
                v[:, :n],
                mask[:, a : a + w, :n],
                scale(),
                positions=pos[:, a : a + w],
                config=cfg,
            )
            assert_dot_equal(part, full[:, a : a + w], (skip, a, w))


def test_attention_positions_bound_the_walk():
    """A key past every row's position is never read: NaN there changes nothing."""
    past, t = 40, 5
    l = past + t + 60
    q, k, v = attn_inputs(1, t, l, torch.float32, seed=2)
    pos = torch.arange(past, past + t, device=DEVICE).view(1, t)
    mask = torch.arange(l, device=DEVICE).view(1, 1, l) <= pos.view(1, t, 1)
    want = attn_tri.attention(q, k[:, : past + t], v[:, : past + t], mask[..., : past + t], scale())
    k2, v2 = k.clone(), v.clone()
    k2[:, past + t + 32 :] = float("nan")  # past the tile's last position's block of keys
    v2[:, past + t + 32 :] = float("nan")
    cfg = (*attn_tri.CONFIGS[torch.float32][:5], False)
    got = attn_tri.attention(q, k2, v2, mask, scale(), positions=pos, config=cfg)
    assert torch.equal(got, want)


def test_attention_row_without_keys_is_nan():
    q, k, v = attn_inputs(1, 2, 70, torch.float32)
    mask = causal_mask(1, 2, 70).clone()
    mask[0, 0] = False
    o = attn_tri.attention(q, k, v, mask, scale())
    assert torch.isnan(o[0, 0]).all() and torch.isfinite(o[0, 1]).all()


# ---------------------------------------------------------------------------- indexer


def index_inputs(b, t, hi, di, nb, seed=0, positive=False):
    gen = torch.Generator().manual_seed(seed)
    rnd = torch.rand if positive else torch.randn
    iq = rnd(b, t, hi, di, generator=gen)
    keys = rnd(b, nb, di, generator=gen)
    return iq.to(DEVICE), keys.to(DEVICE)


def ref_scores(iq, keys):
    b, t, hi, di = iq.shape
    s = iq.reshape(b, t * hi, di) @ keys.transpose(1, 2)
    return s.reshape(b, t, hi, -1).relu().sum(2) / di**0.5


# prompt rows' tiles (tensor-core dots) and decode rows' (the block keys as the dot's rows)
KINDS = pytest.mark.parametrize("decode", [False, True], ids=["prompt rows", "decode rows"])


@KINDS
@pytest.mark.parametrize("nb", [1, 7, 70])
def test_index_scores_match_reference(nb, decode):
    iq, keys = index_inputs(2, 3, 2, 32, nb, seed=nb)
    s = attn_tri.index_scores(iq, keys, decode=decode)
    torch.testing.assert_close(s, ref_scores(iq, keys), rtol=1e-5, atol=1e-5)
    # per row: a row alone equals the same row in the call
    assert_dot_equal(attn_tri.index_scores(iq[1:, 2:], keys[1:], decode=decode), s[1:, 2:])
    # a block key's score does not depend on how many follow it (the lone driver scores whole
    # caches, shared rounds caches cut at the length)
    cut = max(1, nb - 5)
    got = attn_tri.index_scores(iq, keys[:, :cut].contiguous(), decode=decode)
    assert torch.equal(got, s[..., :cut])


def test_decode_rows_scores_are_their_own_whatever_the_window():
    """Decode rows: a row's scores alone (a lone step's, T = 1) are its scores in a verify
    window of three rows and in a batch of sessions, bit for bit."""
    iq, keys = index_inputs(3, 3, 4, 128, 150, seed=11)
    window = attn_tri.index_scores(iq, keys, decode=True)
    for b in range(3):
        for t in range(3):
            alone = attn_tri.index_scores(iq[b : b + 1, t : t + 1], keys[b : b + 1], decode=True)
            assert torch.equal(alone[0, 0], window[b, t])
    rows = iq.transpose(0, 1).reshape(9, 1, 4, 128)  # every row its own batch entry
    spread = attn_tri.index_scores(rows, keys.repeat(3, 1, 1), decode=True)
    assert torch.equal(spread.view(3, 3, -1).transpose(0, 1), window)


def test_decode_rows_past_one_tile_are_scored_as_alone():
    """A verify window of more decode rows than a decode tile's columns (a long copy draft)
    spans two tiles: every row matches the reference, and alone gives its bits."""
    from flashlane.kernels.attention import triton_scores

    t = triton_scores.DECODE_TILE[0] + 3
    iq, keys = index_inputs(2, t, 4, 32, 90, seed=13)
    window = attn_tri.index_scores(iq, keys, decode=True)
    torch.testing.assert_close(window, ref_scores(iq, keys), rtol=1e-5, atol=1e-5)
    for row in (0, t - 1):
        alone = attn_tri.index_scores(iq[1:, row : row + 1], keys[1:], decode=True)
        assert_dot_equal(alone[0, 0], window[1, row])


@KINDS
def test_index_scores_with_positions_compute_every_ranked_column(decode):
    """Given the rows' positions, the columns up to each row's complete blocks are the scores'
    bit for bit (tiles past every row's may be skipped: a short context in a large session)."""
    block, nb = 4, 200  # four tiles of block keys
    iq, keys = index_inputs(2, 3, 2, 32, nb, seed=3)
    full = attn_tri.index_scores(iq, keys, decode=decode)
    pos = torch.tensor([[5, 100, 250], [799, 0, 3]], device=DEVICE)
    got = attn_tri.index_scores(iq, keys, positions=pos, block=block, decode=decode)
    for (i, j), p in zip(((0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)), pos.flatten()):
        reach = (int(p) + 1) // block
        assert torch.equal(got[i, j, :reach], full[i, j, :reach])
    with pytest.raises(ValueError, match="block"):
        attn_tri.index_scores(iq, keys, positions=pos)


@KINDS
@pytest.mark.parametrize("programs", [1, 3, 8])
def test_index_scores_looping_over_tiles_give_the_same_bits(monkeypatch, programs, decode):
    """triton_scores.PROGRAMS: programs that loop over every n-th tile of their row score
    each block key as one program a tile does, with and without the rows' positions."""
    from flashlane.kernels.attention import triton_scores

    block, nb = 4, 200  # four tiles of block keys a row
    iq, keys = index_inputs(2, 3, 2, 32, nb, seed=5)
    pos = torch.tensor([[5, 100, 250], [799, 0, 3]], device=DEVICE)
    full = attn_tri.index_scores(iq, keys, decode=decode)
    bounded = attn_tri.index_scores(iq, keys, positions=pos, block=block, decode=decode)
    monkeypatch.setattr(triton_scores, "PROGRAMS", programs)
    monkeypatch.setattr(triton_scores, "DECODE_PROGRAMS", programs)
    assert torch.equal(attn_tri.index_scores(iq, keys, decode=decode), full)
    got = attn_tri.index_scores(iq, keys, positions=pos, block=block, decode=decode)
    for (i, j), p in zip(((0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)), pos.flatten()):
        reach = (int(p) + 1) // block
        assert torch.equal(got[i, j, :reach], bounded[i, j, :reach])


def test_select_mask_of_short_rows_in_a_large_cache():
    b, t, block, nb = 2, 2, 4, 300  # tiles of block keys past every row's position
    iq, keys = index_inputs(b, t, 2, 32, nb, seed=8)
    keys[:, 40:] = float("nan")  # past the rows' complete blocks: never ranked
    pos = torch.tensor([[60, 61], [150, 30]], device=DEVICE)
    got = attn_tri.select_mask(iq, keys, pos, nb * block, block=block, top_blocks=4)
    want = attn_ref.select_mask(iq, keys, pos, nb * block, block=block, top_blocks=4)
    assert torch.equal(got, want)
    assert (got.sum(-1) < pos + 1).all()


def test_select_mask_dense_region():
    iq, keys = index_inputs(2, 4, 2, 32, 3, seed=1)
    pos = torch.tensor([[8, 9, 10, 11], [0, 1, 2, 3]], device=DEVICE)  # at most 3 complete blocks
    got = attn_tri.select_mask(iq, keys, pos, 12, block=4, top_blocks=3)
    want = attn_ref.select_mask(iq, keys, pos, 12, block=4, top_blocks=3)
    assert torch.equal(got, want)
    assert torch.equal(got[0], torch.ones(12, 12, dtype=torch.bool, device=DEVICE).tril()[8:])


@pytest.mark.parametrize("hi,di", [(2, 32), (4, 24)])
def test_select_mask_sparse_region(hi, di):
    b, t, block, nb = 2, 5, 4, 20
    iq, keys = index_inputs(b, t, hi, di, nb, seed=hi)
    num_keys = nb * block + 3
    pos = torch.tensor([[60, 61, 62, 63, 64], [79, 80, 81, 82, 30]], device=DEVICE)
    got = attn_tri.select_mask(iq, keys, pos, num_keys, block=block, top_blocks=4)
    want = attn_ref.select_mask(iq, keys, pos, num_keys, block=block, top_blocks=4)
    assert torch.equal(got, want)
    assert (got.sum(-1) < pos + 1).all()  # the selection did cut something


def test_select_mask_ties_go_to_lower_blocks():
    block, nb = 4, 8
    iq, keys = index_inputs(1, 1, 2, 32, nb, seed=4, positive=True)
    iq, keys = exact_in_interpreter(iq), exact_in_interpreter(keys)  # ties through any BLAS
    keys[0, 5] = keys[0, 2]
    keys[0, 7] = keys[0, 2]
    s = attn_tri.index_scores(iq, keys)[0, 0]
    assert s[2] == s[5] == s[7]  # repeated keys give bitwise equal scores
    top = int((s > s[2]).sum()) + 2  # the cut falls inside the three-way tie
    pos = torch.tensor([[nb * block + 1]], device=DEVICE)
    got = attn_tri.select_mask(iq, keys, pos, nb * block + 2, block=block, top_blocks=top)
    want = attn_ref.select_mask(iq, keys, pos, nb * block + 2, block=block, top_blocks=top)
    assert torch.equal(got, want)
    kept = got[0, 0, : nb * block].view(nb, block).all(-1)
    assert kept[2] and kept[5] and not kept[7]
    assert int(kept.sum()) == top


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("t", [1, 3])
def test_attention_with_lengths_equals_the_cut_caches_bitwise(t, dtype):
    """Whole caches with the lengths on the device (the lone driver) give the bits of caches
    cut at those lengths; what lies past a length (NaN here) is never read."""
    b, l = 2, 257
    q, k, v = attn_inputs(b, t, l, dtype, seed=9)
    lengths = [200, 37]
    for i, n in enumerate(lengths):
        k[i, n:], v[i, n:] = float("nan"), float("nan")
    mask = sparse_mask(b, t, l, seed=5)
    for i, n in enumerate(lengths):  # queries at the last t positions before each length
        pos = torch.arange(n - t, n, device=DEVICE).view(t, 1)
        mask[i] = mask[i] & (torch.arange(l, device=DEVICE).view(1, l) <= pos)
        mask[i, torch.arange(t, device=DEVICE), pos[:, 0]] = True
    got = attn_tri.attention(q, k, v, mask, scale(), torch.tensor(lengths, device=DEVICE))
    for i, n in enumerate(lengths):
        cut = attn_tri.attention(
            q[i : i + 1], k[i : i + 1, :n], v[i : i + 1, :n], mask[i : i + 1, :, :n].contiguous(),
            scale(),
        )  # fmt: skip
        assert torch.equal(got[i : i + 1], cut)
