"""A round's prompt pieces through a PLE layer side by side (models/layers/ple.py through
Rows.stack_in; Triton's kernels, PROMPTS_TOGETHER or more): each padded to the widest with
its last row, so the n-gram ids, the embedding rows and the causal conv of its real rows are
those of its call alone. Each piece's addition, conv inputs and n-gram history must equal its
piece's alone: bitwise on a GPU; under the interpreter the additions and conv inputs (after
the key and value products' dots) within DOT_TOL, the ids exactly."""

import torch

from flashlane.models.layers.ple import PROMPTS_TOGETHER
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from tests.kernels.triton_env import DEVICE, assert_dot_equal, needs_triton

pytestmark = needs_triton

LENGTHS = [5, 1, 9, 3]  # whole prompts of other lengths


def test_prompt_pieces_together_equal_each_alone():
    from flashlane.kernels.gpu import TRITON

    assert len(LENGTHS) >= PROMPTS_TOGETHER
    cfg, model = build_random(preset("flashnext-tiny"), torch.float32, DEVICE, 0)
    model.use_kernels(TRITON)
    layer = next(i for i, m in enumerate(model.layers) if m.ple is not None)
    ple = model.layers[layer].ple
    gen = torch.Generator().manual_seed(3)
    n = sum(LENGTHS)
    r = torch.randn(n, cfg.hc_count * cfg.hidden_size, generator=gen).to(DEVICE)
    ids = torch.randint(3, cfg.vocab_size, (n,), generator=gen)
    starts = [sum(LENGTHS[:i]) for i in range(len(LENGTHS))]

    def run(which: list[int]):
        sessions = [
            SessionState.empty(cfg, 64, torch.float32, torch.float32, DEVICE) for _ in which
        ]
        spans = [slice(starts[i], starts[i] + LENGTHS[i]) for i in which]
        rows = Rows.of([(s, ids[sp], 0, False, True) for s, sp in zip(sessions, spans)], DEVICE)
        at = torch.cat([torch.arange(sp.start, sp.stop) for sp in spans]).to(DEVICE)
        with torch.no_grad():
            out = ple(r[at], rows, TRITON)
        return [(out[p.rows], *p.pending[("ple", layer)]) for p in rows.pieces]

    together = run(list(range(len(LENGTHS))))
    for i, (add, xfull, history) in enumerate(together):
        ((add1, xfull1, history1),) = run([i])
        assert_dot_equal(add, add1, f"piece {i}: addition")
        assert_dot_equal(xfull, xfull1, f"piece {i}: conv inputs")
        assert torch.equal(history, history1), f"piece {i}: n-gram ids"
