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


def test_chunked_pieces_take_their_states_without_a_host_list(monkeypatch):
    """The chunked call reads the sessions' states as they lie when every piece is chunked,
    and else gathers them by the forward's index tensor (Rows.longs): indexing by a host list
    copied it from pageable memory, and on a GPU the host then waited for the stream at
    every GDN layer of a prefill."""
    import dataclasses

    cfg, model = build_random(preset("flashnext-tiny"), torch.float32, "cpu", 0)
    layer = next(i for i, kind in enumerate(cfg.layer_types) if kind == "linear")
    gdn = model.layers[layer].linear_attn
    seen, asked = [], []

    def spy(q, k, v, g, beta, state, *args, **kw):
        seen.append(state)
        return REFERENCE.chunk_gdn(q, k, v, g, beta, state, *args, **kw)

    longs = Rows.longs

    def spy_longs(self, key, values):
        asked.append((key, values()))
        return longs(self, key, values)

    monkeypatch.setattr(Rows, "longs", spy_longs)
    kernels = dataclasses.replace(REFERENCE, chunk_gdn=spy)
    model.use_kernels(kernels)
    for lengths in ([SHORT_PROMPT + 6], [3, SHORT_PROMPT + 6]):
        sessions = [SessionState.empty(cfg, 128, torch.float32, torch.float32, "cpu")
                    for _ in lengths]  # fmt: skip
        rows = Rows.of([(s, [1] * n, 0, False, True) for s, n in zip(sessions, lengths)], "cpu")
        n = sum(lengths)
        qkv = torch.randn(n, cfg.linear_conv_dim)
        a, b = torch.randn(n, cfg.linear_num_v_heads), torch.randn(n, cfg.linear_num_v_heads)
        gdn.mix(qkv, a, b, rows, kernels)
        if len(lengths) == 1:  # the one session's state itself
            assert seen[-1].data_ptr() == sessions[0].gdn[layer].recurrent.data_ptr()
            assert not [key for key, _ in asked if key.startswith("gdn_rest")]
        else:  # the long piece's, by the forward's index tensor
            assert [v for key, v in asked if key.startswith("gdn_rest")] == [[1]]
