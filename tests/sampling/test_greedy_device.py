"""Plain greedy rows drawn where the logits lie equal the CPU path's draw, ties and bad rows
included (bad rows are left to the CPU path, which names the error)."""

import math

import torch

from flashlane.request import SamplingParams
from flashlane.sampling.choose import (
    DrawSpec,
    SampleError,
    draw_rows,
    greedy_on_device,
    is_plain_greedy,
)

GREEDY = DrawSpec(SamplingParams(temperature=0.0), seed=1, position=5)


def test_plain_greedy_is_only_greedy_without_adjustments():
    assert is_plain_greedy(GREEDY)
    for p in (
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=0.0, logit_bias={3: 1.0}),
        SamplingParams(temperature=0.0, repetition_penalty=1.1),
        SamplingParams(temperature=0.0, presence_penalty=0.5),
        SamplingParams(temperature=0.0, frequency_penalty=0.5),
    ):
        assert not is_plain_greedy(DrawSpec(p, seed=1, position=5))


def test_device_greedy_equals_the_cpu_draw():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, 1000, generator=g)
    logits[1, [7, 300, 999]] = 50.0  # a three-way tie: the lowest id wins
    logits[2, :] = 1.25  # every id ties
    logits[3, 10] = math.nan
    logits[4, 20] = math.inf
    logits[5, :] = -math.inf  # no finite candidate
    logits[6, :500] = -math.inf
    rows = list(range(40))
    picks = greedy_on_device(logits, rows)
    want = draw_rows(logits, [GREEDY] * 40)
    assert set(picks) == set(rows) - {3, 4, 5}
    for r, pick in picks.items():
        assert pick == want[r]
    assert picks[1] == 7 and picks[2] == 0
    assert all(isinstance(want[r], SampleError) for r in (3, 4, 5))
    assert greedy_on_device(logits, []) == {}
