"""adjusted_draw.AdjustedRows: rows with logit_bias or penalties drawn in fixed-shape device ops
give choose.draw_rows' tokens and errors, step after step, from the reply counts they keep.

On the CPU here (the ops are torch's; a GPU runs the same ones inside the lone step's graph,
tests/gpu/test_lone_sampled_gpu.py). Rows sit among others of the step (`rows`), which they
must not touch."""

import numpy as np
import pytest
import torch

from flashlane.request import SamplingParams
from flashlane.sampling import adjusted_draw
from flashlane.sampling.adjusted_draw import AdjustedRows, takes
from flashlane.sampling.choose import DrawSpec, SampleError, draw_full, draw_rows
from flashlane.sampling.spec import failure
from flashlane.sampling.vocab_rows import BIAS_IDS, VocabRows
from tests.sampling.rows import random_row

VOCAB = 1500
TAKEN = [
    SamplingParams(temperature=0.0, logit_bias={17: 1e4}),
    SamplingParams(temperature=0.0, presence_penalty=1e4),
    SamplingParams(temperature=0.0, repetition_penalty=1e4),
    SamplingParams(temperature=0.8, frequency_penalty=0.5, top_k=200),
    SamplingParams(temperature=1.1, top_k=129),  # past the fused kernels' top_k
    SamplingParams(temperature=0.7, presence_penalty=-3.0, min_p=0.05),
    SamplingParams(repetition_penalty=0.6, logit_bias={3: -5.0, 1499: 2.5}, top_k=7),
    SamplingParams(temperature=2.0, frequency_penalty=1.5, presence_penalty=0.25),
    SamplingParams(top_k=3, repetition_penalty=1.3, min_p=0.5),
]
LEFT = [  # OTHER rows the host draws
    SamplingParams(presence_penalty=0.5, top_p=0.9),
    SamplingParams(logit_bias={VOCAB: 1.0}),  # outside the vocabulary: the host names it
    SamplingParams(logit_bias={4: 1e300}),  # could overflow float64
    SamplingParams(repetition_penalty=1e-40),
]


def specs_for(rng, params, prompt_len=6, reply_len=4):
    return [
        DrawSpec(
            p,
            int(rng.integers(0, 2**63)),
            0,
            [int(t) for t in rng.integers(0, VOCAB, prompt_len)],
            [int(t) for t in rng.integers(0, 40, reply_len)],  # repeats: counts above 1
        )
        for p in params
    ]


def test_takes_the_rows_it_can_draw_exactly():
    rng = np.random.default_rng(0)
    assert all(takes(s, VOCAB) for s in specs_for(rng, TAKEN))
    assert not any(takes(s, VOCAB) for s in specs_for(rng, LEFT))
    assert not takes(DrawSpec(SamplingParams(), 1, 0), VOCAB)  # the fused kernels' row
    past_max_k = SamplingParams(frequency_penalty=0.1, top_k=5000)
    assert takes(DrawSpec(past_max_k, 1, 0), VOCAB)  # top_k past V: no limit
    assert not takes(DrawSpec(past_max_k, 1, 0), 10 * VOCAB)
    full = {t: float(t % 7) - 3.0 for t in range(BIAS_IDS)}  # a list's worth of bias ids
    assert takes(DrawSpec(SamplingParams(logit_bias=full), 1, 0), VOCAB)
    over = SamplingParams(logit_bias={**full, BIAS_IDS: 1.0})
    assert not takes(DrawSpec(over, 1, 0), VOCAB)  # the host draws it
    adj = AdjustedRows(4, VOCAB, torch.device("cpu"))
    ok, bad_reply = specs_for(rng, TAKEN[1:3])
    bad_reply = DrawSpec(bad_reply.params, 1, 0, [1, 2], [5, VOCAB + 3])
    assert adj.load([ok, bad_reply, *specs_for(rng, LEFT[:1])], [3, 1, 0]) == [3]
    assert adj.key == (1, False, False, 0)


def steps(params, num_steps: int, seed: int, tie: bool = False):
    """num_steps steps of one load (`call`), its rows every other row of the step."""
    rng = np.random.default_rng(seed)
    specs = specs_for(rng, params)
    adj = AdjustedRows(2 * len(specs), VOCAB, torch.device("cpu"))
    return call(adj, specs, rng, num_steps, tie)


def call(adj: AdjustedRows, specs, rng, num_steps: int, tie: bool = False):
    """A lone call's draws: the specs loaded into every other row of adj's B, then num_steps
    steps, each comparing the loaded rows with draw_rows at the position drawn, the reply as
    it stood, then appending the token."""
    b = adj.b
    rows = list(range(1, b, 2))[: len(specs)]
    assert adj.load(specs, rows) == rows
    tokens = []
    for step in range(num_steps):
        logits = torch.stack([random_row(rng, VOCAB) for _ in range(b)])
        if tie:  # ties at every top_k's edge
            logits[:, :60] = 4.0
        positions = torch.tensor(rng.integers(0, 2**40, b))
        out = torch.full((b, 2), -99, dtype=torch.long)
        tok = torch.full((b,), -7, dtype=torch.long)
        adj(logits, out, tok, positions)
        at = [
            DrawSpec(s.params, s.seed, int(positions[r]), s.prompt_ids, list(s.reply_ids))
            for s, r in zip(specs, rows)
        ]
        want = draw_rows(logits[rows], at)
        if step == 0:
            assert want == [draw_full(logits[r], a) for r, a in zip(rows, at)]
        assert out[0::2].eq(-99).all() and tok[0::2].eq(-7).all()  # the other rows
        for (code, flag), t, w in zip(out[rows].tolist(), tok[rows].tolist(), want):
            if isinstance(w, SampleError):
                assert (flag, t) == (0, 0) and str(failure(code)) == str(w)
            else:
                assert (code, flag, t) == (w, 1, w)
        for s, w in zip(specs, want):
            if not isinstance(w, SampleError):
                s.reply_ids.append(w)
        tokens.append(want)
    return tokens


@pytest.mark.parametrize("group", [4, adjusted_draw.GROUP])
def test_steps_equal_the_cpu_draws_as_the_replies_grow(group, monkeypatch):
    monkeypatch.setattr(adjusted_draw, "GROUP", group)  # 4: the rows in three groups
    by_row = list(zip(*steps(TAKEN, 8, seed=1)))
    # what the adjustments must have done (a draw that ignored them would fail)
    assert set(by_row[0]) == {17}  # logit_bias +1e4 on id 17
    assert len(set(by_row[1])) == len(by_row[1])  # presence 1e4: never the same id twice


def test_draws_of_every_size_share_one_pool_and_keep_their_tokens():
    """The lone driver's draws of sizes 8 and 4 share their [B, V] buffers
    (sampling/vocab_rows.py): the smaller's call overwrites rows the larger's loaded, and the
    larger's next call, which loads its replies' counts and prompt ids anew, still draws
    draw_rows' tokens; the memory is one buffer of the largest size's rows."""
    rng = np.random.default_rng(21)
    pool = VocabRows(8, VOCAB, torch.device("cpu"))
    big, small = (AdjustedRows(b, VOCAB, torch.device("cpu"), pool) for b in (8, 4))
    wide = specs_for(rng, [TAKEN[0], TAKEN[2], TAKEN[6], TAKEN[7]])  # bias, seen, counts
    narrow = specs_for(rng, [TAKEN[1], TAKEN[6]])
    call(big, wide, rng, 2)
    call(small, narrow, rng, 2)
    assert small.counts.data_ptr() == big.counts.data_ptr()
    assert small.bias[1].data_ptr() == big.bias[1].data_ptr()
    assert small.seen.data_ptr() == big.seen.data_ptr()
    call(big, wide, rng, 2)
    # counts and seen, 8 rows each, and the bias as 8 rows of ids and values
    assert pool.nbytes() == 8 * VOCAB * (4 + 1) + 8 * BIAS_IDS * (8 + 8)


def test_a_full_list_of_bias_ids_draws_the_cpu_tokens():
    full = {t: float(t % 7) - 3.0 for t in range(BIAS_IDS)}
    params = [SamplingParams(logit_bias=full), SamplingParams(temperature=0.9, logit_bias=full)]
    steps(params, 3, seed=30)


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_top_k_ties_keep_the_lower_ids(seed):
    params = [SamplingParams(top_k=k, presence_penalty=0.1) for k in (1, 5, 59, 60, 61, 300)]
    steps(params, 3, seed=seed, tie=True)


def test_failures_name_the_cpu_errors():
    rng = np.random.default_rng(9)
    specs = specs_for(rng, TAKEN[:4])
    adj = AdjustedRows(4, VOCAB, torch.device("cpu"))
    adj.load(specs, [0, 1, 2, 3])
    logits = torch.stack([random_row(rng, VOCAB) for _ in range(4)])
    logits[0, 7] = logits[0, 900] = torch.nan
    logits[0, 5] = torch.inf
    logits[1, 300] = logits[1, 1200] = torch.inf
    logits[2] = -torch.inf
    out, tok = torch.zeros(4, 2, dtype=torch.long), torch.zeros(4, dtype=torch.long)
    positions = torch.arange(4) + 10
    adj(logits, out, tok, positions)
    at = [
        DrawSpec(s.params, s.seed, 10 + i, s.prompt_ids, s.reply_ids) for i, s in enumerate(specs)
    ]
    want = draw_rows(logits, at)
    got = [str(failure(c)) if not f else c for c, f in out.tolist()]
    assert (
        got[:3]
        == [str(w) for w in want[:3]]
        == [
            "NaN logit at id 7",
            "+inf logit at id 300",
            "no finite candidate logit",
        ]
    )
    assert got[3] == want[3]
    assert adj.counts[:3].sum().item() == 4 * 3  # a failed row counts nothing


def test_a_warm_up_step_puts_the_counts_back():
    """The counts are what a step moves on besides the driver's inputs: StepBuffers.inputs
    hands them (views) to lone_buffers.warm_up, which zeroes them for its step on the pad
    session and copies them back; counts the warm-up step added would penalize a token the
    reply never drew."""
    from flashlane.runner.lone_buffers import StepBuffers, warm_up

    rng = np.random.default_rng(12)
    specs = specs_for(rng, TAKEN[1:3])
    adj = AdjustedRows(2, VOCAB, torch.device("cpu"))
    adj.load(specs, [0, 1])
    before = adj.counts[:2].clone()
    draw = type("Draw", (), {"moved": adj.moved, "key": ()})()
    io = StepBuffers(2, 4, 8, torch.float32, torch.device("cpu"), draw)
    io.table = torch.ones(3, 2, 4)
    logits = torch.stack([random_row(rng, VOCAB) for _ in range(2)])
    seen = []

    def step():
        seen.append(int(adj.counts[:2].sum()))  # zeroed for the warm-up step
        adj(logits, torch.zeros(2, 2, dtype=torch.long), io.tok, torch.tensor([5, 6]))
        seen.append(int(adj.counts[:2].sum()))

    warm_up(io, torch.zeros(3, 2, 4), step)
    assert seen == [0, 2] and io.warm
    assert torch.equal(adj.counts[:2], before) and io.table.eq(1).all()
