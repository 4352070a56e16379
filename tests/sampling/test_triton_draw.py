"""triton_draw: the fused kernels return the CPU path's tokens. On a GPU, or on the CPU under
TRITON_INTERPRET=1 (small vocabularies and blocks, so rows span many chunks); skipped in CI."""

import math

import numpy as np
import pytest
import torch

from flashlane.request import SamplingParams
from flashlane.sampling.choose import DrawSpec, SampleError, draw_rows
from flashlane.sampling.gpu import draw_rows_gpu
from tests.kernels.triton_env import DEVICE, HAS_CUDA, needs_triton
from tests.sampling import vectors
from tests.sampling.rows import random_row, random_spec

pytestmark = needs_triton

BLOCK = 4096 if HAS_CUDA else 1024
VOCABS = (3001, 7919) if not HAS_CUDA else (3001, 65_537, 248_320)
FUSED = [  # every kind the kernels take, at its edges
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=1e-6),
    SamplingParams(),
    SamplingParams(temperature=0.3),
    SamplingParams(temperature=3.0, min_p=0.05),
    SamplingParams(min_p=1.0),
    SamplingParams(min_p=0.3),
    SamplingParams(top_k=1),
    SamplingParams(top_k=2, temperature=0.7),
    SamplingParams(top_k=20),
    SamplingParams(top_k=128, temperature=1.5),
    SamplingParams(top_k=20, top_p=0.95),
    SamplingParams(top_k=50, top_p=0.5, min_p=0.01),
    SamplingParams(top_k=5, top_p=1e-9),
    SamplingParams(top_k=20, min_p=0.05),
    SamplingParams(top_k=100, top_p=0.999, temperature=0.3),
]


def fused(logits, specs):
    from flashlane.sampling.fused_draw import draw_rows_fused

    return draw_rows_fused(logits.to(DEVICE), specs, block=BLOCK)


def assert_same(got, want, specs):
    assert len(got) == len(want)
    for g, w, spec in zip(got, want, specs):
        if isinstance(w, SampleError):
            assert isinstance(g, SampleError) and str(g) == str(w), spec.params
        else:
            assert g == w, spec.params


def assert_fused_matches(logits, specs):
    """The kernels' settled rows equal the CPU path; returns how many they settled."""
    want = draw_rows(logits, specs)
    got = fused(logits, specs)
    settled = [i for i, g in enumerate(got) if g is not None]
    assert_same([got[i] for i in settled], [want[i] for i in settled], [specs[i] for i in settled])
    return len(settled)


def spread_rows(rng, num_rows, vocab):
    """Peaked, flat, rounded (ties), partly -inf rows, in turn."""
    rows = []
    for i in range(num_rows):
        kind = i % 4
        if kind == 0:
            row = rng.normal(size=vocab) * 2.0
            row[rng.integers(0, vocab, 8)] += np.linspace(12.0, 18.0, 8)
        elif kind == 1:
            row = rng.normal(size=vocab)
        elif kind == 2:
            row = np.round(rng.normal(size=vocab) * 3.0)
        else:
            row = rng.normal(size=vocab) * 10.0
            row[rng.random(vocab) < 0.4] = -np.inf
        rows.append(torch.from_numpy(row.astype(np.float32)))
    return torch.stack(rows)


@pytest.mark.parametrize("vocab", VOCABS)
def test_every_fused_kind_on_awkward_vocabularies(vocab):
    rng = np.random.default_rng(vocab)
    logits = spread_rows(rng, len(FUSED), vocab)
    for shift in range(2):  # each kind on two spreads
        params = FUSED[shift:] + FUSED[:shift]
        specs = [
            DrawSpec(p, int(rng.integers(0, 2**63)), int(rng.integers(0, 300_000))) for p in params
        ]
        n = assert_fused_matches(logits, specs)
        assert n >= len(specs) - 1  # all settled, bar a top_p cut too close to call


def test_random_batches_through_draw_rows_gpu():
    rng = np.random.default_rng(0)
    settled = total = 0
    for _ in range(6):
        vocab = int(rng.choice([3000, 3001, 5000, 8191]))
        rows = [random_row(rng, vocab) for _ in range(16)]
        for i in np.flatnonzero(rng.random(16) < 0.1):
            rows[i][int(rng.integers(0, vocab))] = float(rng.choice([math.nan, math.inf]))
        specs = [random_spec(rng, vocab) for _ in range(16)]
        logits = torch.stack(rows)
        settled += assert_fused_matches(logits, specs)
        total += len(specs)
        got = draw_rows_gpu(logits.to(DEVICE), specs, fused=True)
        assert_same(got, draw_rows(logits, specs), specs)
    assert settled > total // 3


def test_ties_signed_zeros_and_minus_inf():
    vocab = 3000
    rows = torch.zeros(8, vocab)
    rows[1, ::2] = -0.0  # -0.0 and +0.0 tie: the lower id first
    rows[2, 100:200] = 1.0  # 100 ids tied at the top
    rows[3, :] = -math.inf
    rows[3, [5, 2999]] = 2.0  # two candidates, fewer than top_k
    rows[4, :] = -math.inf  # no candidate
    rows[5, 7] = 1e-30  # a tiny positive beats the zeros
    rows[6, 1500:1530] = 4.0  # top_k cuts through a tie spanning chunks
    rows[7, :] = torch.arange(vocab) % 7  # many ties at each value
    rng = np.random.default_rng(5)
    for params in FUSED:
        specs = [DrawSpec(params, int(rng.integers(0, 2**63)), 40 + i) for i in range(8)]
        assert_fused_matches(rows, specs)
        got = fused(rows, specs)
        assert isinstance(got[4], SampleError) and "no finite candidate" in str(got[4])


def test_bad_logits_are_left_to_the_torch_path_which_names_them():
    logits = torch.randn(4, 3000)
    logits[0, 17] = math.nan
    logits[1, 2000] = math.inf
    logits[2, [5, 9]] = torch.tensor([math.inf, math.nan])
    specs = [DrawSpec(SamplingParams(top_k=3), 1, 2), DrawSpec(SamplingParams(), 1, 2)] * 2
    assert fused(logits, specs)[:3] == [None] * 3
    got = draw_rows_gpu(logits.to(DEVICE), specs, fused=True)
    assert_same(got, draw_rows(logits, specs), specs)
    assert "NaN logit at id 17" in str(got[0]) and "+inf logit at id 2000" in str(got[1])


def test_matches_every_vector():
    for entry in vectors.load()["draws"]:
        logits, spec = vectors.logits_of(entry), vectors.spec_of(entry)
        (got,) = draw_rows_gpu(logits[None, :].to(DEVICE), [spec], fused=True)
        assert isinstance(got, SampleError) if entry.get("error") else got == entry["token"]


def test_mixed_call_with_every_kind_and_the_torch_rows():
    vocab = 7001
    rng = np.random.default_rng(9)
    logits = spread_rows(rng, 24, vocab)
    params = [
        *FUSED,
        SamplingParams(top_k=200),
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(logit_bias={3: 5.0}, temperature=0.0),
        SamplingParams(presence_penalty=0.5, top_k=20),
        SamplingParams(top_p=0.95),
        SamplingParams(top_p=0.5, min_p=0.1),
        SamplingParams(top_k=vocab),
        SamplingParams(top_k=vocab + 3, min_p=0.2),
    ]
    specs = [DrawSpec(p, 1000 + i, 77, [1, 2, 3], [4, 5]) for i, p in enumerate(params)]
    got = fused(logits, specs)
    assert got[len(FUSED) : len(FUSED) + 4] == [None] * 4  # top_k > 128, penalties, bias
    assert sum(g is not None for g in got[len(FUSED) + 4 :]) >= 3  # top_p rows are fused now
    got = draw_rows_gpu(logits.to(DEVICE), specs, fused=True)
    assert_same(got, draw_rows(logits, specs), specs)


# top_p without top_k (triton_top_p): the winner over all ids, or the best few scores walked
# in score order, each kept or dropped by the mass of the candidates before it.
TOP_PS = (0.5, 0.9, 0.95, 0.99, 1.0)
TEMPERATURES = (0.7, 1.0, 1.5)
SMALL_BLOCK = 512  # small rows still span several chunks under the interpreter


def fused_small(logits, specs):
    from flashlane.sampling.fused_draw import draw_rows_fused

    return draw_rows_fused(logits.to(DEVICE), specs, block=SMALL_BLOCK)


def assert_top_p_rows(logits, specs):
    """Settled rows equal the CPU path and draw_rows_gpu gives the CPU path's tokens and errors
    for every row; returns the rows the kernels settled."""
    want = draw_rows(logits, specs)
    got = fused_small(logits, specs)
    settled = [i for i, g in enumerate(got) if g is not None]
    assert_same([got[i] for i in settled], [want[i] for i in settled], [specs[i] for i in settled])
    assert_same(draw_rows_gpu(logits.to(DEVICE), specs, fused=True), want, specs)
    return settled


def top_p_specs(rng, num_rows, top_p, temperature, min_p=0.0):
    p = SamplingParams(top_p=top_p, temperature=temperature, min_p=min_p)
    return [DrawSpec(p, int(rng.integers(0, 2**63)), int(rng.integers(0, 10**6))) for _ in
            range(num_rows)]  # fmt: skip


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_top_p_rows_match_the_cpu_path(temperature):
    rng = np.random.default_rng(int(temperature * 10))
    logits = spread_rows(rng, 8, 2001)  # peaked, flat, ties, -inf, twice
    settled = total = 0
    for top_p in TOP_PS:
        specs = top_p_specs(rng, 8, top_p, temperature)
        settled += len(assert_top_p_rows(logits, specs))
        total += len(specs)
    assert settled >= total - 3  # a cut too close to call, or every best score dropped: rare


def test_top_p_settles_most_peaked_rows():
    rng = np.random.default_rng(21)
    logits = torch.stack([spread_rows(rng, 1, 3001)[0] for _ in range(16)])  # all peaked
    settled = assert_top_p_rows(logits, top_p_specs(rng, 16, 0.95, 1.0))
    assert len(settled) >= 15
    settled = assert_top_p_rows(logits, top_p_specs(rng, 16, 0.9, 0.7, min_p=0.05))
    assert len(settled) >= 14


def test_top_p_cut_ids_that_win():
    """Few candidates: the best score is often past the cut, so the kernels must walk the next
    best scores and decide each from the exact mass before it (ties at the cut included)."""
    vocab = 1500
    rows = torch.full((6, vocab), -math.inf)
    rows[0, [7, 600, 1000, 1100, 1499]] = torch.tensor([3.0, 2.5, 2.0, 1.5, 1.0])
    rows[1, [5, 6, 510, 1023, 1024, 1400]] = torch.tensor([3.0, 2.0, 2.0, 2.0, 2.0, 1.0])
    rows[2, :] = torch.randn(vocab) - 20.0
    rows[2, [11, 700, 1450]] = torch.tensor([4.0, 3.2, 3.1])
    rows[3, 100:140] = 1.0  # a tie holds the whole cut
    rows[3, 60] = 1.5
    rows[4, :] = 0.0  # equal logits: the running sum is exact, the cut falls at an id
    rows[5, :] = torch.arange(vocab) % 5  # many ties at each value, across chunks
    rng = np.random.default_rng(11)
    settled = walked = total = 0
    for top_p in (0.5, 0.75, 0.9):
        for _ in range(3):
            specs = top_p_specs(rng, 6, top_p, 1.0)
            want = draw_rows(rows, specs)
            settled_rows = assert_top_p_rows(rows, specs)
            settled += len(settled_rows)
            total += len(specs)
            winners = [draw_rows(rows, [DrawSpec(SamplingParams(), s.seed, s.position)])[0]
                       for s in specs]  # fmt: skip
            walked += sum(want[i] != winners[i] for i in settled_rows)
    assert settled >= total * 3 // 4
    assert walked >= 3  # some settled rows were not the unfiltered winner


def test_top_p_bad_rows_give_the_cpu_errors():
    logits = torch.randn(4, 1200)
    logits[0, 17] = math.nan
    logits[1, 900] = math.inf
    logits[2, :] = -math.inf
    specs = top_p_specs(np.random.default_rng(3), 4, 0.95, 1.0)
    got = fused_small(logits, specs)
    assert got[:2] == [None, None]  # the torch path names the bad id
    assert isinstance(got[2], SampleError) and "no finite candidate" in str(got[2])
    assert got[3] is not None
    assert_top_p_rows(logits, specs)
