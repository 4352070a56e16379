"""choose.py and prune.py: the reference vectors, the filters at their edges, the
adjustments, errors, and fast == full."""

import math

import numpy as np
import pytest
import torch

from flashlane.request import SamplingParams
from flashlane.sampling import prune
from flashlane.sampling.choose import (
    DrawSpec,
    SampleError,
    adjusted,
    draw,
    draw_full,
    draw_rows,
)
from flashlane.sampling.keyed import gumbel_np, row_key, uniforms_np
from flashlane.sampling.prune import blocked_sum
from tests.sampling import vectors
from tests.sampling.rows import random_row, random_spec


def outcome(fn, logits, spec):
    try:
        return fn(logits, spec)
    except SampleError as err:
        return err


def test_every_draw_vector():
    failures = []
    for i, entry in enumerate(vectors.load()["draws"]):
        logits, spec = vectors.logits_of(entry), vectors.spec_of(entry)
        for fn in (draw, draw_full):
            got = outcome(fn, logits, spec)
            ok = isinstance(got, SampleError) if entry.get("error") else got == entry["token"]
            if not ok:
                failures.append((i, fn.__name__, got, entry.get("token"), entry["discriminates"]))
    assert not failures


def test_draw_rows_matches_vectors_with_errors_in_their_slots():
    entries = [e for e in vectors.load()["draws"] if len(e.get("logits", ())) == 16]
    assert any(e.get("error") for e in entries)
    got = draw_rows(
        torch.stack([vectors.logits_of(e) for e in entries]),
        [vectors.spec_of(e) for e in entries],
    )
    for entry, token in zip(entries, got):
        assert isinstance(token, SampleError) if entry.get("error") else token == entry["token"]


def spec_for(seed=7, position=3, **params):
    return DrawSpec(SamplingParams(**params), seed, position)


def drawn_set(logits, num_seeds=300, **params):
    """The set of tokens over many seeds, checking fast == full on each."""
    row = torch.tensor(logits, dtype=torch.float32)
    tokens = set()
    for seed in range(num_seeds):
        spec = spec_for(seed=seed, **params)
        token = draw(row, spec)
        assert token == draw_full(row, spec)
        tokens.add(token)
    return tokens


@pytest.mark.parametrize("top_k", [0, 5, 6])
def test_top_k_zero_or_at_least_v_keeps_all(top_k):
    assert drawn_set([0.1, 0.0, 0.2, 0.1, -0.1], top_k=top_k) == {0, 1, 2, 3, 4}


def test_top_k_one_keeps_the_first_candidate():
    assert drawn_set([1.0, 3.0, 3.0, 2.0], top_k=1) == {1}


def test_top_k_ties_at_the_cut_go_to_the_lower_ids():
    assert drawn_set([1.0, 5.0, 3.0, 3.0, 3.0], top_k=2, temperature=5.0) == {1, 2}
    assert drawn_set([1.0, 5.0, 3.0, 3.0, 3.0], top_k=3, temperature=5.0) == {1, 2, 3}


def test_top_p_reaching_the_target_exactly_keeps_that_candidate():
    # Equal logits: e = 1 each, S = 4; running sums 1, 2, 3, 4 hit 0.5 * S at the second id.
    assert drawn_set([2.0] * 4, top_p=0.5) == {0, 1}
    assert drawn_set([2.0] * 4, top_p=0.25) == {0}
    assert drawn_set([2.0] * 4, top_p=0.5000001) == {0, 1, 2}
    assert drawn_set([2.0] * 4 + [-math.inf], top_p=0.5) == {0, 1}


def test_top_p_counts_only_top_k_candidates_in_s():
    # top_k 2 leaves e = (1, 1): S = 2, so top_p 0.5 keeps one id (S over all ids would be 4).
    assert drawn_set([2.0] * 4, top_k=2, top_p=0.5) == {0}
    assert drawn_set([2.0] * 4, top_k=2, top_p=0.51) == {0, 1}


def test_min_p_edges():
    assert drawn_set([2.0, 2.0, 1.0], min_p=1.0) == {0, 1}
    assert drawn_set([2.0, 2.0, 1.0], min_p=0.0) == {0, 1, 2}
    # min_p equal to a candidate's e keeps it; the next float up drops it.
    e = float(np.exp(np.float64(np.float32(0.5)) - 2.0))
    assert drawn_set([2.0, 0.5], min_p=e) == {0, 1}
    assert drawn_set([2.0, 0.5], min_p=float(np.nextafter(e, 1.0))) == {0}


def test_greedy_ties_go_to_the_lower_id_after_adjustments():
    row = torch.tensor([1.0, 3.0, 3.0, 2.0])
    for temperature in (0.0, 9.99e-6):
        assert draw(row, spec_for(temperature=temperature)) == 1
        assert draw(row, spec_for(temperature=temperature, logit_bias={1: -1.0})) == 2
        assert draw(row, spec_for(temperature=temperature, logit_bias={3: 1.0})) == 1


def test_sampled_score_ties_go_to_the_lower_id():
    # fp32 logits rarely tie exactly, so build float64 z where ids i < j score the same:
    # z_j = s - g_j with fl(z_j + g_j) == s, z_j > z_i so that j comes first in the order.
    key = row_key(11, 5)
    g = gumbel_np(uniforms_np(key, np.arange(64)))
    pairs = [(i, j) for i in range(64) for j in range(i + 1, 64) if g[j] < g[i]]
    ties = [(i, j) for i, j in pairs if (1.0 + g[i] - g[j]) + g[j] == 1.0 + g[i]]
    assert ties
    for i, j in ties[:20]:
        z = np.full(64, -100.0)
        z[i], z[j] = 1.0, 1.0 + g[i] - g[j]
        for params in (SamplingParams(), SamplingParams(top_k=2), SamplingParams(top_p=0.99)):
            assert prune.pruned_choice(z, params, key) == i


def test_adjustments_follow_design_order_and_arithmetic():
    row = np.array([2.0, -2.0, 1.0, 0.0, 3.0], dtype=np.float32)
    spec = DrawSpec(
        SamplingParams(
            logit_bias={0: -3.0, 4: 0.5},
            repetition_penalty=2.0,
            presence_penalty=0.5,
            frequency_penalty=0.25,
        ),
        seed=0,
        position=0,
        prompt_ids=[1, 1, 3],
        reply_ids=[2, 2, 0],
    )
    # bias first (2 - 3 = -1), then repetition (negative: * 2), then presence + frequency.
    expected = [-1.0 * 2 - (0.5 + 0.25), -4.0, 1.0 / 2 - (0.5 + 0.5), 0.0, 3.5]
    assert adjusted(row, spec).tolist() == expected


def test_presence_and_frequency_count_only_the_reply():
    row = np.zeros(4, dtype=np.float32)
    spec = DrawSpec(SamplingParams(frequency_penalty=1.0), 0, 0, [1, 1, 1], [2])
    assert adjusted(row, spec).tolist() == [0.0, 0.0, -1.0, 0.0]


@pytest.mark.parametrize(
    ("logits", "params", "message"),
    [
        ([0.0, math.nan, 1.0], {}, "NaN logit at id 1"),
        ([0.0, 1.0, math.inf], {}, r"\+inf logit at id 2"),
        ([0.0, 1.0, math.inf], {"temperature": 0.0}, r"\+inf logit at id 2"),
        ([-math.inf] * 3, {}, "no finite candidate"),
        ([-math.inf] * 3, {"temperature": 0.0}, "no finite candidate"),
        ([0.0, 1.0], {"logit_bias": {2: 1.0}}, "logit_bias id 2 is outside"),
    ],
)
def test_bad_rows_raise_sample_error(logits, params, message):
    row = torch.tensor(logits, dtype=torch.float32)
    for fn in (draw, draw_full):
        with pytest.raises(SampleError, match=message):
            fn(row, spec_for(**params))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_penalty_that_overflows_a_logit_fails_the_row(temperature):
    row = torch.tensor([1.0, 3e38])
    params = SamplingParams(temperature=temperature, repetition_penalty=1e-300)
    spec = DrawSpec(params, 0, 0, [1], [])
    for fn in (draw, draw_full):
        with pytest.raises(SampleError, match=r"\+inf after logit_bias and penalties"):
            fn(row, spec)


def test_minus_inf_ids_are_never_drawn():
    assert drawn_set([0.0, -math.inf, 0.0, -math.inf], temperature=100.0) == {0, 2}


def test_draw_rows_fails_only_the_bad_row():
    rows = torch.tensor([[0.0, 1.0, 2.0], [0.0, math.nan, 1.0], [3.0, 2.0, 1.0]])
    specs = [spec_for(seed=s) for s in range(3)]
    got = draw_rows(rows, specs)
    assert isinstance(got[1], SampleError)
    assert [got[0], got[2]] == [draw(rows[0], specs[0]), draw(rows[2], specs[2])]


def sequential_blocked_sum(values):
    total = 0.0
    for start in range(0, len(values), 1024):
        block = 0.0
        for v in values[start : start + 1024]:
            block += v
        total += block
    return total


def test_blocked_sum_adds_left_to_right_in_blocks():
    rng = np.random.default_rng(0)
    for size in (1, 1023, 1024, 1025, 5000):
        # Mixed magnitudes make every order of addition round differently.
        values = rng.random(size) * 10.0 ** rng.integers(-17, 1, size)
        assert blocked_sum(values) == sequential_blocked_sum(values.tolist())
        ids = np.sort(rng.choice(size, max(1, size // 3), replace=False))
        dense = np.zeros(size)
        dense[ids] = values[ids]
        assert prune._sparse_blocked_sum(ids, values[ids]) == blocked_sum(dense)
    assert blocked_sum(np.array([1.0] + [2.0**-53] * 8)) == 1.0  # not pairwise


def assert_fast_equals_full(rng, num_rows, vocab_of):
    for _ in range(num_rows):
        vocab = vocab_of(rng)
        logits, spec = random_row(rng, vocab), random_spec(rng, vocab)
        fast, full = outcome(draw, logits, spec), outcome(draw_full, logits, spec)
        assert type(fast) is type(full) and str(fast) == str(full), spec.params


def test_fast_equals_full_on_10000_narrow_rows():
    assert_fast_equals_full(np.random.default_rng(0), 10_000, lambda r: int(r.integers(1, 301)))


def spy_on_slice_cut(monkeypatch):
    """Counts prune._cut_in_slice's answers: 'cut' (proven) or 'deferred' (None)."""
    seen = {"cut": 0, "deferred": 0}
    cut_in_slice = prune._cut_in_slice

    def spy(*args):
        kept = cut_in_slice(*args)
        seen["cut" if kept is not None else "deferred"] += 1
        return kept

    monkeypatch.setattr(prune, "_cut_in_slice", spy)
    return seen


def test_fast_equals_full_on_medium_rows_through_every_shortcut(monkeypatch):
    seen = spy_on_slice_cut(monkeypatch)
    assert_fast_equals_full(np.random.default_rng(1), 120, lambda r: 40_000)
    assert seen["cut"] > 0


def test_wide_top_p_cut_exactly_on_the_target(monkeypatch):
    # 20,000 equal logits, top_p 0.5: the running sum hits the target exactly at id 9999, so
    # the sliced shortcut must defer to the exact order.
    seen = spy_on_slice_cut(monkeypatch)
    row = torch.full((20_000,), 1.5)
    for seed in range(20):
        spec = spec_for(seed=seed, top_p=0.5)
        token = draw(row, spec)
        assert token < 10_000 and token == draw_full(row, spec)
    assert seen == {"cut": 0, "deferred": 20}


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_fast_equals_full_on_10000_full_width_rows():
    # About 30 ms a row on one core: five minutes.
    assert_fast_equals_full(np.random.default_rng(2), 10_000, lambda r: 248_320)
