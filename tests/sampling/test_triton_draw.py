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
    from flashlane.sampling.triton_draw import draw_rows_fused

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
        SamplingParams(top_p=0.95),
        SamplingParams(top_k=200),
        SamplingParams(repetition_penalty=1.3),
        SamplingParams(logit_bias={3: 5.0}, temperature=0.0),
        SamplingParams(presence_penalty=0.5, top_k=20),
        SamplingParams(top_p=0.5, min_p=0.1),
        SamplingParams(top_k=vocab),
        SamplingParams(top_k=vocab + 3, min_p=0.2),
    ]
    specs = [DrawSpec(p, 1000 + i, 77, [1, 2, 3], [4, 5]) for i, p in enumerate(params)]
    assert fused(logits, specs)[len(FUSED) : len(FUSED) + 6] == [None] * 6
    got = draw_rows_gpu(logits.to(DEVICE), specs, fused=True)
    assert_same(got, draw_rows(logits, specs), specs)
