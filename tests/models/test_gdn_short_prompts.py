"""Short whole prompts in one round (models/layers/gated_deltanet.py `_short`): their GDN
rows go through one conv, one heads and one recurrent call, side by side and padded to the
widest with -inf gates (a decay of 1, beta 0: the state goes through a padded row as it
is). Each piece's outputs, conv inputs and final state must be those of its piece alone;
a longer prompt in the same round keeps the chunked rule. The references (here, on the CPU)
run the short pieces one call each; tests/kernels/test_gdn_short_prompts_triton.py runs
this check on Triton's kernels, where they go together."""

import pytest
import torch

from flashlane.kernels import REFERENCE
from flashlane.models.layers.gated_deltanet import SHORT_PROMPT
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState

# whole prompts: four short ones of other lengths, one past SHORT_PROMPT (the chunked rule)
LENGTHS = [5, 1, 9, 3, SHORT_PROMPT + 6]
ALL_SHORT = LENGTHS[:4]  # every piece short: the group's states as they are, no gather


def short_prompts_equal_alone(
    kernels, device: str, dtype: torch.dtype, exact=None, lengths=LENGTHS
) -> None:
    """exact(got, want) -> None or why they differ (default: torch.equal)."""
    cfg, model = build_random(preset("flashnext-tiny"), dtype, device, 0)
    model.use_kernels(kernels)
    layer = next(i for i, kind in enumerate(cfg.layer_types) if kind == "linear")
    gdn = model.layers[layer].linear_attn
    gen = torch.Generator().manual_seed(2)
    n = sum(lengths)
    qkv = torch.randn(n, cfg.linear_conv_dim, generator=gen, dtype=dtype).to(device)
    a, b = (
        torch.randn(n, cfg.linear_num_v_heads, generator=gen, dtype=dtype).to(device) for _ in "ab"
    )
    starts = [sum(lengths[:i]) for i in range(len(lengths))]

    def run(which: list[int]):
        sessions = [SessionState.empty(cfg, 128, dtype, dtype, device) for _ in which]
        rows = Rows.of(
            [(s, [1] * lengths[i], 0, False, True) for s, i in zip(sessions, which)], device
        )
        at = torch.cat([torch.arange(starts[i], starts[i] + lengths[i]) for i in which])
        at = at.to(device)
        o = gdn.mix(qkv[at], a[at], b[at], rows, kernels)
        return [
            (o[p.rows], *p.pending[("gdn", layer)]) for p in rows.pieces
        ]  # (rows, conv inputs, final state) a piece

    same = exact or (lambda got, want: None if torch.equal(got, want) else "bits differ")
    together = run(list(range(len(lengths))))
    for i, got in enumerate(together):
        (want,) = run([i])
        for name, g, w in zip(("rows", "conv inputs", "state"), got, want):
            assert g.shape == w.shape, (i, name, g.shape, w.shape)
            why = same(g, w)
            assert why is None, f"piece {i} ({lengths[i]} rows), {name}: {why}"


@pytest.mark.parametrize("lengths", [LENGTHS, ALL_SHORT])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_short_prompts_together_equal_each_alone(dtype, lengths):
    short_prompts_equal_alone(REFERENCE, "cpu", dtype, lengths=lengths)
