"""gpu.py: the batched device draw returns the CPU path's tokens. It is plain torch, so CI runs
it on the CPU; the `cuda` test confirms it on a GPU at full vocabulary."""

import math

import numpy as np
import pytest
import torch

from flashlane.request import SamplingParams
from flashlane.sampling import gpu
from flashlane.sampling.choose import DrawSpec, SampleError, draw_rows
from flashlane.sampling.gpu import draw_rows_gpu
from tests.sampling import vectors
from tests.sampling.rows import random_row, random_rows, random_spec

WIDE = 248_320


def assert_same(got, want, specs):
    assert len(got) == len(want)
    for g, w, spec in zip(got, want, specs):
        if isinstance(w, SampleError):
            assert isinstance(g, SampleError) and str(g) == str(w), spec.params
        else:
            assert g == w, spec.params


def test_matches_the_cpu_path_on_random_batches():
    rng = np.random.default_rng(0)
    for _ in range(200):
        vocab = int(rng.integers(1, 400))
        rows = [random_row(rng, vocab) for _ in range(16)]
        for i in np.flatnonzero(rng.random(16) < 0.03):
            rows[i][int(rng.integers(0, vocab))] = float(rng.choice([math.nan, math.inf]))
        specs = [random_spec(rng, vocab) for _ in range(16)]
        logits = torch.stack(rows)
        assert_same(draw_rows_gpu(logits, specs), draw_rows(logits, specs), specs)


def test_matches_every_vector():
    for entry in vectors.load()["draws"]:
        logits, spec = vectors.logits_of(entry), vectors.spec_of(entry)
        (got,) = draw_rows_gpu(logits[None, :], [spec])
        assert isinstance(got, SampleError) if entry.get("error") else got == entry["token"]


def test_matches_the_cpu_path_on_full_width_rows():
    rng = np.random.default_rng(1)
    gen = torch.Generator().manual_seed(1)
    logits = random_rows(gen, 8, WIDE)
    logits[0, :] = torch.randn(WIDE, generator=gen)  # a flat row under each filter
    specs = [random_spec(rng, WIDE) for _ in range(8)]
    specs[0] = DrawSpec(SamplingParams(top_p=0.95), 5, 6)
    assert_same(draw_rows_gpu(logits, specs), draw_rows(logits, specs), specs)


def test_unproven_top_p_cut_falls_back_to_the_cpu(monkeypatch):
    # Equal logits: the running sum hits top_p * S exactly, within any rounding bound.
    calls = []

    def spy(logits, specs):
        calls.append(len(specs))
        return draw_rows(logits, specs)

    monkeypatch.setattr(gpu, "draw_rows", spy)
    logits = torch.full((3, 20_000), 0.5)
    specs = [DrawSpec(SamplingParams(top_p=0.5), s, 9) for s in range(3)]
    got = draw_rows_gpu(logits, specs)
    assert calls == [3]
    assert got == draw_rows(logits, specs) and all(t < 10_000 for t in got)


def test_mixed_batch_with_greedy_errors_and_out_of_vocabulary_ids():
    logits = torch.tensor(
        [
            [1.0, 3.0, 3.0, 2.0],
            [0.0, math.nan, 1.0, 2.0],
            [-math.inf] * 4,
            [-math.inf] * 4,
            [0.5, 0.1, 0.2, 0.3],
            [0.5, 0.1, 0.2, 0.3],
            [0.5, 0.1, 0.2, 0.3],
            [0.5, 3e38, 0.2, 0.3],
            [0.5, 3e38, 0.2, 0.3],
        ]
    )
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(),
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=2),
        SamplingParams(logit_bias={4: 1.0}),
        SamplingParams(repetition_penalty=1.5),
        SamplingParams(top_p=0.5, min_p=0.9),
        SamplingParams(temperature=0.0, repetition_penalty=1e-300),
        SamplingParams(repetition_penalty=1e-300),
    ]
    specs = [DrawSpec(p, 3, 4, [0, 9 if i in (4, 5) else 1], [1]) for i, p in enumerate(params)]
    got = draw_rows_gpu(logits, specs)
    assert got[0] == 1
    assert [type(t) for t in got[1:6]] == [SampleError] * 5
    assert "outside the vocabulary" in str(got[4]) and "id 9" in str(got[5])
    assert all("+inf after" in str(t) for t in got[7:])
    assert_same(got, draw_rows(logits, specs), specs)


@pytest.mark.cuda
@pytest.mark.timeout(1800)  # the CPU path's side: a few minutes
def test_cuda_draws_equal_the_cpu_path_on_10000_full_width_rows():
    rng = np.random.default_rng(2)
    gen = torch.Generator(device="cuda").manual_seed(2)
    num_rows, batch = 10_000, 50
    for _ in range(num_rows // batch):
        logits = random_rows(gen, batch, WIDE)
        specs = [random_spec(rng, WIDE) for _ in range(batch)]
        got = draw_rows_gpu(logits, specs)
        assert_same(got, draw_rows(logits.cpu(), specs), specs)
