"""lone_draw.KeyedDraw: a lone step's keyed draw gives the shared rounds' tokens and errors.

Over random logits and several steps, its positions moving on the device: the host path (the
CPU's, in every run) and the fused path (triton_draw's launches and the landing kernel, on a
GPU or under TRITON_INTERPRET=1) each equal choose.draw_rows at position pos + 1, and the
fused one draw_rows_fused too. A top_p row the kernels leave UNSETTLED is settled from the
logits the step kept, to the shared rounds' token, which goes into the next step's input."""

import numpy as np
import pytest
import torch

from flashlane.request import SamplingParams
from flashlane.sampling.choose import DrawSpec, SampleError, draw_rows
from flashlane.sampling.kinds import OTHER, is_always_settled, row_kind
from flashlane.sampling.lone_draw import UNSETTLED, KeyedDraw
from flashlane.sampling.spec import failure
from tests.kernels.triton_env import DEVICE, HAS_CUDA, needs_triton
from tests.sampling.rows import random_row

VOCAB = 3001
BLOCK = 4096 if HAS_CUDA else 1024  # the interpreter: rows span several chunks
ADMITTED = [
    SamplingParams(temperature=0.0),
    SamplingParams(),
    SamplingParams(temperature=0.3),
    SamplingParams(temperature=3.0, min_p=0.05),
    SamplingParams(min_p=1.0),
    SamplingParams(top_k=1),
    SamplingParams(top_k=20, temperature=0.7),
    SamplingParams(top_k=128, temperature=1.5, min_p=0.01),
    SamplingParams(top_k=VOCAB + 5),  # every id: a plain row
]
HOST_DRAWN = [  # rows the kernels do not take (kinds.OTHER): drawn on the host every step
    SamplingParams(temperature=0.0, logit_bias={17: 1e4}),
    SamplingParams(temperature=0.0, presence_penalty=1e4),
    SamplingParams(temperature=0.0, repetition_penalty=1e4),
    SamplingParams(temperature=0.8, frequency_penalty=0.5, top_k=200),
    SamplingParams(temperature=1.1, top_k=129),  # past the kernels' top_k
]
TOP_P = [  # rows a lone step takes that the kernels may leave unsettled
    SamplingParams(top_p=0.5),
    SamplingParams(top_p=0.9, temperature=0.7, min_p=0.02),
    SamplingParams(top_k=40, top_p=0.8, temperature=1.3),
    SamplingParams(top_k=128, top_p=0.95, temperature=0.5),
]


def triton_test(f):
    for mark in needs_triton:
        f = mark(f)
    return f


def specs_of(rng, params):
    return [DrawSpec(p, int(rng.integers(0, 2**63)), 0) for p in params]


def run_steps(draw: KeyedDraw, specs, rng, num_steps: int, device, bad: bool = False):
    """num_steps steps over fresh random logits; each step's out equals draw_rows at
    position pos + 1, tok the token (0 where none) and pos moves on by one."""
    b = len(specs)
    draw.load(specs)
    start = rng.integers(0, 300_000, b)
    pos = torch.tensor(start, dtype=torch.long, device=device)
    tok = torch.zeros(b, dtype=torch.long, device=device)
    out = torch.full((b, 2), -99, dtype=torch.long, device=device)
    num_failed = 0
    for step in range(num_steps):
        logits = torch.stack([random_row(rng, VOCAB) for _ in range(b)])
        if bad:  # a NaN, a +inf after a NaN-free prefix, no finite candidate
            logits[0, 7] = logits[0, 2000] = torch.nan
            logits[0, 5] = torch.inf
            logits[1, 1500] = logits[1, 2900] = torch.inf
            logits[2] = -torch.inf
        at = [int(p) + 1 for p in start + step]
        want = draw_rows(logits, [DrawSpec(s.params, s.seed, p) for s, p in zip(specs, at)])
        draw(logits.to(device), out, tok, pos)
        got = out.cpu().tolist()
        for (code, flag), w, t in zip(got, want, tok.cpu().tolist()):
            if isinstance(w, SampleError):
                num_failed += 1
                assert flag == 0 and t == 0 and str(failure(code)) == str(w)
            else:
                assert (code, flag, t) == (w, 1, w)
        assert pos.cpu().tolist() == (start + step + 1).tolist()
    return num_failed


def test_host_path_equals_the_cpu_draws():
    rng = np.random.default_rng(1)
    specs = specs_of(rng, ADMITTED + TOP_P)
    draw = KeyedDraw(len(specs), VOCAB, torch.device("cpu"), fused=False)
    run_steps(draw, specs, rng, 3, "cpu")
    assert run_steps(draw, specs, rng, 1, "cpu", bad=True) == 3


def test_load_takes_every_row_and_keeps_host_rows_one_step_in_flight():
    """Rows the kernels do not take (logit_bias, penalties, top_k past MAX_TOP_K) load too;
    like top_p rows they may need the host, so the step keeps its logits."""
    draw = KeyedDraw(1, VOCAB, torch.device("cpu"), fused=False)
    for p in HOST_DRAWN:
        assert row_kind(p, VOCAB) == OTHER and not is_always_settled(p, VOCAB)
        draw.load([DrawSpec(p, 1, 0)])
        assert draw.may_need_host
    with pytest.raises(ValueError, match="takes 1 rows, not 0"):
        draw.load([])  # one row per stream
    for p in ADMITTED:
        draw.load([DrawSpec(p, 1, 0)])
        assert is_always_settled(p, VOCAB) and not draw.may_need_host
    for p in TOP_P:
        draw.load([DrawSpec(p, 1, 0)])
        assert row_kind(p, VOCAB) != OTHER and not is_always_settled(p) and draw.may_need_host


def penalized_steps(draw: KeyedDraw, device: str, num_steps: int = 4) -> list[list[int]]:
    """Steps over the same logits each step for HOST_DRAWN rows beside a plain row, each row
    with its prompt and a reply that grows by its landed token after each step (the lane
    host's conclude, before the next step is settled), as the specs' own lists. Each step's
    tokens equal draw_rows with the reply as it stood; returns the rows' tokens per step."""
    rng = np.random.default_rng(11)
    greedy = SamplingParams(temperature=0.0)  # row 2's logits without its penalty
    params = [*HOST_DRAWN, greedy, SamplingParams(temperature=0.9)]
    logits = torch.stack([random_row(rng, VOCAB) for _ in params])
    logits[len(HOST_DRAWN)] = logits[2]
    top = [int(i) for i in logits.argmax(1)]
    prompts = [[top[i], 5, 9] for i in range(len(params))]  # the best id seen in the prompt
    replies = [[int(t)] for t in rng.integers(0, VOCAB, len(params))]  # the pending token
    specs = [
        DrawSpec(p, int(rng.integers(0, 2**63)), 0, prompt, reply)
        for p, prompt, reply in zip(params, prompts, replies)
    ]
    draw.load(specs)
    b = len(specs)
    pos = torch.tensor(rng.integers(0, 9000, b), dtype=torch.long, device=device)
    tok, out = torch.zeros_like(pos), torch.zeros(b, 2, dtype=torch.long, device=device)
    steps = []
    for _ in range(num_steps):
        at = [[*r] for r in replies]
        draw(logits.to(device), out, tok, pos)
        rows = out.cpu().tolist()
        if draw.fused:  # adjusted_draw lands them in the step: nothing to settle
            assert not draw.may_need_host and UNSETTLED not in [r[0] for r in rows]
        rows = draw.settle(rows, tok, pos)
        want = draw_rows(logits, [DrawSpec(s.params, s.seed, int(p), s.prompt_ids, a)
                                  for s, p, a in zip(specs, pos.tolist(), at)])  # fmt: skip
        assert rows == [[w, 1] for w in want]
        assert tok.cpu().tolist() == want
        for reply, w in zip(replies, want):
            reply.append(w)
        steps.append(want)
    return steps


def check_penalized(steps: list[list[int]]) -> None:
    """What the penalties must have done (so a draw that ignored them would fail)."""
    by_row = list(zip(*steps))
    assert set(by_row[0]) == {17}  # logit_bias +1e4 on id 17
    assert len(set(by_row[1])) == len(by_row[1])  # presence 1e4: never the same id twice
    assert by_row[2][0] != by_row[len(HOST_DRAWN)][0]  # repetition 1e4 on the prompt's best


def test_host_path_draws_penalized_rows_with_the_reply_so_far():
    draw = KeyedDraw(len(HOST_DRAWN) + 2, VOCAB, torch.device("cpu"), fused=False)
    check_penalized(penalized_steps(draw, "cpu"))


@triton_test
def test_fused_steps_draw_penalized_rows_with_the_reply_so_far():
    draw = KeyedDraw(len(HOST_DRAWN) + 2, VOCAB, torch.device(DEVICE), fused=True, block=BLOCK)
    assert draw.fused
    check_penalized(penalized_steps(draw, DEVICE))


@triton_test
def test_fused_steps_leave_penalized_top_p_rows_to_settle():
    """An adjusted row with top_p (its cut needs the host's proof) lands UNSETTLED beside an
    adjusted row drawn in the step; settle draws it with the reply as it stood."""
    rng = np.random.default_rng(4)
    params = [SamplingParams(presence_penalty=2.0, top_p=0.9), HOST_DRAWN[1]]
    specs = [DrawSpec(p, 7 + i, 0, [1, 2], [3, 3, 4]) for i, p in enumerate(params)]
    draw = KeyedDraw(2, VOCAB, torch.device(DEVICE), fused=True, block=BLOCK)
    draw.load(specs)
    assert draw.may_need_host
    pos = torch.tensor([5, 9], device=DEVICE)
    tok, out = torch.zeros_like(pos), torch.zeros(2, 2, dtype=torch.long, device=DEVICE)
    logits = torch.stack([random_row(rng, VOCAB) for _ in params])
    draw(logits.to(DEVICE), out, tok, pos)
    rows = out.cpu().tolist()
    assert rows[0] == [UNSETTLED, 0] and rows[1][1] == 1
    want = draw_rows(logits, [DrawSpec(s.params, s.seed, int(p), s.prompt_ids, s.reply_ids)
                              for s, p in zip(specs, pos.tolist())])  # fmt: skip
    assert draw.settle(rows, tok, pos) == [[w, 1] for w in want]
    assert tok.cpu().tolist() == want


def test_settle_draws_an_unsettled_row_as_shared_rounds_and_feeds_it():
    """The device's UNSETTLED (injected here: the CPU's draw always settles) is drawn on the
    host from the logits the step kept, at the position the step drew; tok gets the token."""
    rng = np.random.default_rng(5)
    specs = specs_of(rng, [TOP_P[0], ADMITTED[1], TOP_P[2]])
    draw = KeyedDraw(3, VOCAB, torch.device("cpu"), fused=False)
    draw.load(specs)
    pos = torch.tensor([40, 7, 2**40])
    tok, out = torch.zeros(3, dtype=torch.long), torch.zeros(3, 2, dtype=torch.long)
    for step in range(3):
        logits = torch.stack([random_row(rng, VOCAB) for _ in range(3)])
        if step == 2:
            logits[2, 9] = torch.nan  # a row without a token stays failed
        draw(logits, out, tok, pos)
        assert draw.logits is logits
        at = [DrawSpec(s.params, s.seed, int(p)) for s, p in zip(specs, pos)]
        want = draw_rows(logits, at)
        rows = out.tolist()
        landed = [list(r) for r in rows]
        for i in (0, 2):  # what the landing kernel writes for an unsettled row
            rows[i], tok[i] = [UNSETTLED, 0], 0
        assert draw.settle(rows, tok, pos) == landed
        assert tok.tolist() == [r[0] if r[1] else 0 for r in landed]
        assert isinstance(want[2], SampleError) == (step == 2)
        assert [r[0] for r in landed[:2]] == want[:2]
    assert str(failure(landed[2][0])) == "NaN logit at id 9"


@triton_test
@pytest.mark.parametrize("num_rows", [1, len(ADMITTED)])
def test_fused_steps_equal_the_cpu_draws(num_rows):
    from flashlane.sampling.fused_draw import draw_rows_fused

    rng = np.random.default_rng(num_rows)
    specs = specs_of(rng, ADMITTED[-num_rows:])
    draw = KeyedDraw(num_rows, VOCAB, torch.device(DEVICE), fused=True, block=BLOCK)
    assert draw.fused
    run_steps(draw, specs, rng, 3 if num_rows == 1 else 2, DEVICE)
    if num_rows >= 3:
        assert run_steps(draw, specs, rng, 1, DEVICE, bad=True) == 3
    # the shared rounds' fused call on one more step's logits: the same tokens
    logits = torch.stack([random_row(rng, VOCAB) for _ in range(num_rows)]).to(DEVICE)
    pos = torch.arange(num_rows, device=DEVICE) * 1000
    out = torch.zeros(num_rows, 2, dtype=torch.long, device=DEVICE)
    draw(logits, out, torch.zeros_like(pos), pos.clone())
    at = [DrawSpec(s.params, s.seed, int(p) + 1) for s, p in zip(specs, pos.tolist())]
    assert out[:, 0].cpu().tolist() == draw_rows_fused(logits, at, block=BLOCK)


def test_failure_codes_name_the_shared_rounds_errors():
    messages = [str(failure(c)) for c in (-1, -4, -5, -4 - 2 * 17, -5 - 2 * 3, 0)]
    assert messages == [
        "no finite candidate logit",
        "NaN logit at id 0",
        "+inf logit at id 0",
        "NaN logit at id 17",
        "+inf logit at id 3",
        "the row has no finite logit",
    ]


def degenerate_rows(vocab: int) -> torch.Tensor:
    """Rows whose top_p cut sits exactly on top_p * S, too close for the kernels to call:
    row 0 all equal (top_k 128, top_p 0.5: the cut's running sum is exactly the target),
    row 1 two equal candidates (top_p 0.5: the second one's mass ahead is exactly the target;
    unsettled whenever it scores best). Row 2 is random, a plain row beside them."""
    rows = torch.full((3, vocab), -torch.inf)
    rows[0] = 0.0
    rows[1, [100, 2500]] = 0.25
    rows[2] = random_row(np.random.default_rng(0), vocab)
    return rows


@triton_test
def test_fused_unsettled_rows_are_settled_as_shared_rounds_do():
    """The kernels leave degenerate top_p cuts UNSETTLED; settle draws them from the logits
    the step kept, equal to the CPU's draw and to the shared rounds' cascade (draw_rows_gpu:
    the same kernels, then the torch path), and the next step's input holds the token."""
    from flashlane.sampling.gpu import draw_rows_gpu

    rng = np.random.default_rng(3)
    params = [
        SamplingParams(top_k=128, top_p=0.5),
        SamplingParams(top_p=0.5),
        SamplingParams(temperature=0.8),
    ]
    specs = specs_of(rng, params)
    draw = KeyedDraw(3, VOCAB, torch.device(DEVICE), fused=True, block=BLOCK)
    draw.load(specs)
    assert draw.fused and draw.may_need_host and draw.key[4]  # the step keeps its logits
    pos = torch.tensor([5, 6005, 77], device=DEVICE)  # row 1 unsettled at 6006 and 6008
    tok, out = torch.zeros_like(pos), torch.zeros(3, 2, dtype=torch.long, device=DEVICE)
    logits = degenerate_rows(VOCAB).to(DEVICE)
    num_unsettled = 0
    for _ in range(4):
        draw(logits, out, tok, pos)
        assert draw.logits is draw.held and torch.equal(draw.held, logits)
        rows = out.cpu().tolist()
        assert rows[0] == [UNSETTLED, 0] and rows[2][1] == 1
        num_unsettled += sum(r == [UNSETTLED, 0] for r in rows)
        at = [DrawSpec(s.params, s.seed, int(p)) for s, p in zip(specs, pos.tolist())]
        want = draw_rows(logits.cpu(), at)
        assert want[1] == 100  # the first candidate alone reaches top_p * S
        settled = draw.settle(rows, tok, pos)
        assert settled == [[w, 1] for w in want]
        assert tok.cpu().tolist() == want
        assert want == draw_rows_gpu(logits, at, fused=True)
    assert num_unsettled >= 5


def test_the_kernels_number_row_kinds_and_statuses_as_the_sampler_does():
    """kinds.py and spec.py name the kernels' row kinds and statuses without Triton, and the
    kernels name their own (they import nothing from the sampler): the two must agree."""
    pytest.importorskip("triton")
    from flashlane.kernels.sampling import triton_draw, triton_keyed
    from flashlane.sampling import kinds, spec

    names = ("OTHER", "GREEDY", "PLAIN", "TOP_K", "TOP_P")
    assert [getattr(triton_keyed, n) for n in names] == [getattr(kinds, n) for n in names]
    assert len({getattr(kinds, n) for n in names}) == len(names)
    assert (triton_draw.NO_CANDIDATE, triton_draw.UNSETTLED) == (spec.NO_CANDIDATE, spec.UNSETTLED)


def test_logprobs_rows_are_reported_in_the_step_and_settled_rows_on_the_host():
    """Rows that ask for logprobs need no host (the step reports them); a row the host
    settles gets them from the kept logits with its settled token, as shared rounds do."""
    from flashlane.sampling.logprobs import row_logprobs

    rng = np.random.default_rng(8)
    params = [SamplingParams(temperature=0.0, logprobs=2), SamplingParams(logprobs=4)]
    draw = KeyedDraw(3, VOCAB, torch.device("cpu"), fused=False)
    draw.load([DrawSpec(p, 3 + i, 0) for i, p in enumerate([*params, ADMITTED[1]])])
    assert not draw.may_need_host and draw.reported.rows == ((0, 2), (1, 4))
    draw.load([DrawSpec(p, 3 + i, 0) for i, p in enumerate([*params, TOP_P[0]])])
    assert draw.may_need_host  # the top_p row's
    pos, tok = torch.tensor([10, 20, 30]), torch.zeros(3, dtype=torch.long)
    out = torch.zeros(3, 2, dtype=torch.long)
    logits = torch.stack([random_row(rng, VOCAB) for _ in range(3)])
    draw(logits, out, tok, pos)
    draw.post(1)
    landed = out.tolist()
    rows = [list(r) for r in landed]
    rows[1], tok[1] = [UNSETTLED, 0], 0  # the report read tok 0 for it; the host settles
    assert draw.settle(rows, tok, pos, slot=1) == landed
    want = {
        i: row_logprobs(logits[i : i + 1], [landed[i][0]], top)[0] for i, top in ((0, 2), (1, 4))
    }
    assert draw.logprobs == want
