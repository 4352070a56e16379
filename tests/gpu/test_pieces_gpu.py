"""Prompt pieces on the GPU, bit for bit (DESIGN.md section 1): a prompt's state and every
later logit do not depend on how its pieces were cut on the CHUNK grid, on the other prompts
packed into the same forward, or on the decode windows beside it in a round. A served run
(issue 28) saw one reply in 64 part from its alone reply at concurrency 4 with drafts, the
lone driver and the prompt cache each off in turn: the rounds left are prompt pieces beside
other streams' work, which test_exact_gpu.py never builds.

Then the same through an engine: replies of staggered streams (they arrive and leave while
others decode and fill) equal each alone, greedy and seeded, drafting on."""

import dataclasses
import itertools

import pytest
import torch

from flashlane.config import EngineConfig
from flashlane.engine import Engine
from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.models.flashnext import commit
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from flashlane.request import SamplingParams
from flashlane.runner.graphs import Graphs
from tests.gpu.models import gpu_model_named

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
CAP = 512
STEPS = 12


@pytest.fixture(scope="module", params=["tiny", "flashnext-4l", "qwen3-next-4l"])
def gpu_model(request, oracle_by_name):
    cfg, model = gpu_model_named(request.param, oracle_by_name)
    model.graphs = Graphs(max_rows=64)  # pieces of 64 rows replay, longer ones run eagerly
    yield cfg, model
    del model
    torch.cuda.empty_cache()


def ids(vocab: int, n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def new_session(cfg, cap: int = CAP) -> SessionState:
    return SessionState.empty(cfg, cap, torch.bfloat16, torch.float32, "cuda")


@torch.no_grad()
def forward(model, entries):
    """One forward over (session, tokens, start, recurrent, keep) entries: each entry whose
    keep is True is committed whole, the others are rolled back. -> logits per entry."""
    rows = Rows.of([(s, torch.tensor(t, device="cuda"), a, r) for s, t, a, r, _ in entries], "cuda")
    logits = model.logits(model.residual(rows))
    for p, e in zip(rows.pieces, entries):
        commit(model, p, p.length if e[4] else 0)
    return [logits[p.rows] for p in rows.pieces]


def greedy(model, session, first: int) -> torch.Tensor:
    """STEPS greedy one-row steps from a filled session -> their logits [STEPS, V]."""
    tok, out = first, []
    for _ in range(STEPS):
        lg = forward(model, [(session, [tok], session.length, True, True)])[0][0]
        out.append(lg)
        tok = int(lg.argmax())
    return torch.stack(out)


def others(cfg, model, n: int) -> list[SessionState]:
    """n sessions filled with prompts of their own (the streams a round carries beside)."""
    out = []
    for i in range(n):
        s = new_session(cfg)
        forward(model, [(s, ids(cfg.vocab_size, 40 + 30 * i, 100 + i), 0, False, True)])
        out.append(s)
    return out


def fill(cfg, model, prompt: list[int], schedule: str) -> tuple[torch.Tensor, SessionState]:
    """The prompt fed by `schedule` -> (its last row's logits, the filled session).

    whole: one piece alone; cut: pieces of 64 alone; packed: one piece beside another
    prompt's longer piece; packed_cut: pieces of 64, each beside another prompt's piece;
    mixed: pieces of 64, each beside three other streams' verify windows (rolled back)."""
    s, n = new_session(cfg), len(prompt)
    cuts = [0, n] if schedule in ("whole", "packed") else [*range(0, n, 64), n]
    side = others(cfg, model, 3) if schedule == "mixed" else []
    other = new_session(cfg, 4 * CAP)
    other_ids = ids(cfg.vocab_size, 3 * n + 128, 7)
    last = None
    for a, b in itertools.pairwise(cuts):
        entries = [(s, prompt[a:b], a, False, True)]
        if schedule.startswith("packed"):
            # the other prompt's own pieces, on the grid and longer than this one's
            c, m = other.length, -(-(b - a) // 64) * 64 + 64
            entries.insert(0, (other, other_ids[c : c + m], c, False, True))
        for i, o in enumerate(side):
            w = ids(cfg.vocab_size, 1 + i, 50 + a + i)
            entries.insert(i, (o, w, o.length, True, False))
        last = forward(model, entries)[-1][-1]  # the prompt's piece is the round's last
    return last, s


@pytest.mark.parametrize("length", [128, 150, 64 * 5])
def test_prompt_bits_do_not_depend_on_pieces_or_neighbours(gpu_model, length):
    cfg, model = gpu_model
    prompt = ids(cfg.vocab_size, length, length)
    want_last, s = fill(cfg, model, prompt, "whole")
    want = greedy(model, s, int(want_last.argmax()))
    for schedule in ("cut", "packed", "packed_cut", "mixed"):
        last, s = fill(cfg, model, prompt, schedule)
        assert torch.equal(last, want_last), f"{schedule}: the prompt's last logits"
        got = greedy(model, s, int(last.argmax()))
        steps = (got != want).any(-1).nonzero().flatten().tolist()
        assert not steps, f"{schedule}: greedy steps {steps} differ"


@pytest.fixture(scope="module")
def staggered_llm():
    """flashnext-4l (random, real per-layer dimensions) behind an engine with its default
    flags on the GPU: four sessions, drafting on, graphs, the lone driver."""
    cfg, model = build_random(preset("flashnext-4l"), torch.bfloat16, "cuda", seed=3)
    config = EngineConfig.resolve(device="cuda", parallel=4, context=1024, prompt_cache_gb=0)
    costs = CostTable(
        {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2
    )
    yield LLM.from_engine(Engine(config, costs=costs, built=(cfg, model)))
    torch.cuda.empty_cache()


def test_staggered_replies_equal_alone(staggered_llm):
    llm = staggered_llm
    vocab = llm.engine.model_config.vocab_size
    lens = [128, 150, 70, 200, 128, 64, 190, 131, 128, 96]
    prompts = [ids(vocab, n, 1000 + i) for i, n in enumerate(lens)]
    for base in (
        SamplingParams(temperature=0.0, ignore_eos=True),
        SamplingParams(temperature=0.8, top_p=0.95, seed=5, ignore_eos=True),
    ):
        # different lengths: streams leave at different rounds and the next prompts fill
        # beside the ones still decoding
        plist = [dataclasses.replace(base, max_tokens=24 + 17 * (i % 4)) for i in range(10)]
        together = llm.generate(prompts, plist)
        for i, (prompt, p, got) in enumerate(zip(prompts, plist, together)):
            alone = llm.generate(prompt, p)[0]
            assert got.error is None
            assert got.token_ids == alone.token_ids, f"prompt {i} ({len(prompt)} tokens)"
