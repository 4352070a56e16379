"""Programmatic dependent launch changes when kernels start, never what they compute
(kernels/pdl.py): with FLASHLANE_PDL on and off, a prompt and greedy one-row rounds (eager
and graphed) give the same logits bit for bit, and graphed lone steps the same tokens and
session state."""

import pytest
import torch

from flashlane.kernels import select_kernels
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.runner.graphs import Graphs
from flashlane.runner.lone import LoneDriver
from tests.gpu.test_exact_gpu import prefilled, prompts, run_windows
from tests.gpu.test_lone_gpu import copy_of
from tests.runner.test_lone import state_of

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]


def run(graphed: bool):
    """flashnext-4l (random, real per-layer sizes): logits of a 130-token prompt's last row
    and 12 greedy one-row rounds, then 12 lone steps from the same prompt (tokens, state)."""
    torch.cuda.synchronize()
    cfg, model = build_random(preset("flashnext-4l"), torch.bfloat16, "cuda", seed=1)
    model.use_kernels(select_kernels("cuda"))
    if graphed:
        model.graphs = Graphs(max_rows=64)
    base = prefilled(cfg, model, prompts(cfg.vocab_size, 4)[3])
    s = copy_of(cfg, base)
    tokens, logits = [3], []
    for _ in range(12):
        lg = run_windows(model, [(s, tokens[-1:])], keep=True)[0][0]
        logits.append(lg)
        tokens.append(int(lg.argmax()))
    lone = copy_of(cfg, base)
    driver = LoneDriver(model, [lone], graphs=graphed)
    got = [3]

    def take(token, finite):
        got.append(token)
        return True

    driver.decode(0, 3, lone.length, 12, take)
    torch.cuda.synchronize()
    return torch.stack(logits), tokens, got, state_of(lone)


@pytest.mark.parametrize("graphed", [True, False])
def test_pdl_on_and_off_give_the_same_bits(monkeypatch, graphed):
    monkeypatch.setenv("FLASHLANE_PDL", "0")
    off = run(graphed)
    monkeypatch.setenv("FLASHLANE_PDL", "1")
    on = run(graphed)
    assert torch.equal(on[0], off[0])
    assert on[1] == off[1] and on[2] == off[2] == on[1][: len(on[2])]
    assert len(on[3]) == len(off[3])
    for a, b in zip(on[3], off[3]):
        assert torch.equal(a, b)
