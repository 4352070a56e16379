"""What each rank of the tensor-parallel tests runs (a module of its own: spawned processes
import it by name). `replies` is the eager reference path at any TP degree."""

from __future__ import annotations

from pathlib import Path

import torch

from flashlane.kernels import REFERENCE
from flashlane.models.flashnext import run_piece
from flashlane.models.layers.moe import SparseMoe
from flashlane.models.loader import load_checkpoint
from flashlane.models.rows import Rows
from flashlane.models.state import SessionState
from flashlane.parallel.group import TensorParallel, join, leave
from flashlane.parallel.plan import shard_config, shard_model
from flashlane.request import SamplingParams
from flashlane.runner.backend import copy_session
from flashlane.sampling.choose import draw_rows
from flashlane.sampling.spec import DrawSpec

PROMPT = [(7 * i + 3) % 500 + 2 for i in range(40)]
OTHER_PROMPT = [(11 * i + 5) % 500 + 2 for i in range(12)]
STEPS = 4
GREEDY = SamplingParams(temperature=0.0)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, top_k=50)


def load(ckpt: str, tp: TensorParallel | None, placed: bool = False):
    """The checkpoint in fp64 (the CPU path), cut to tp's rank (`placed`: experts placed
    whole, expert parallel); (rank's config, model)."""
    cfg, model = load_checkpoint(Path(ckpt), torch.float64, "cpu")
    if tp is not None:
        shard_model(model, tp, placed)
    model.use_kernels(REFERENCE)
    return shard_config(cfg, tp.size if tp else 1, placed), model


def session(cfg, capacity: int = 64) -> SessionState:
    return SessionState.empty(cfg, capacity, torch.float64, torch.float64)


def fork(cfg, s: SessionState) -> SessionState:
    out = session(cfg, s.capacity)
    copy_session(s, out, cfg.indexer_block)
    return out


def decode(model, s: SessionState, last: torch.Tensor, params, seed: int):
    """STEPS keyed draws after PROMPT (in s; last: its last row's logits [V]), one row a
    forward -> (tokens, the logits of the rows that fed them [STEPS, V])."""
    row, reply, rows = last, [], []
    for _ in range(STEPS):
        pos = len(PROMPT) + len(reply)
        tok = draw_rows(row[None], [DrawSpec(params, seed, pos, PROMPT, list(reply))])[0]
        reply.append(int(tok))
        row = run_piece(model, s, torch.tensor([tok]), pos, True)[0]
        rows.append(row)
    return reply, torch.stack(rows)


def replies(ckpt: str, tp: TensorParallel | None, placed: bool = False) -> dict:
    """The prompt's logits, greedy and seeded replies, and at this degree: two prompts in
    one forward (batched) and the greedy reply fed back as one window (drafted)."""
    cfg, model = load(ckpt, tp, placed)
    moe = next(m for m in model.modules() if isinstance(m, SparseMoe))
    held = tuple(moe.experts.gate_proj.shape[:2])  # the rank's (experts, width)
    s = session(cfg)
    out = {"logits": run_piece(model, s, torch.tensor(PROMPT), 0, False), "held": held}
    seeded, drafted = fork(cfg, s), fork(cfg, s)
    out["greedy"], out["greedy_logits"] = decode(model, s, out["logits"][-1], GREEDY, 0)
    out["seeded"], out["seeded_logits"] = decode(model, seeded, out["logits"][-1], SEEDED, 99)
    tokens = torch.tensor(out["greedy"])
    out["drafted"] = run_piece(model, drafted, tokens, len(PROMPT), True)
    a, b = session(cfg), session(cfg)
    with torch.no_grad():
        rows = Rows.of([(a, PROMPT, 0, False), (b, OTHER_PROMPT, 0, False)], "cpu")
        both = model.logits(model.residual(rows))
    n = len(PROMPT)
    out["batched"], out["other_batched"] = both[:n], both[n:]
    out["other_alone"] = run_piece(model, session(cfg), torch.tensor(OTHER_PROMPT), 0, False)
    return out


def run_rank(rank: int, size: int, port: int, ckpt: str, out: str, placed: bool = False) -> None:
    """One spawned rank: join the group on 127.0.0.1:port, compute, rank 0 saves."""
    torch.set_num_threads(1)
    tp = join("cpu", size, rank, port)
    try:
        result = replies(ckpt, tp, placed)
        if rank == 0:
            torch.save(result, out)
    finally:
        leave()


SPAWN_TRIES = 4  # spawns of one group while its ranks die of a signal (spawn_ranks)


def spawn_ranks(fn, size: int, *args) -> None:
    """mp.spawn(fn, (size, port, *args)) on a fresh 127.0.0.1 port; again on another port, up
    to SPAWN_TRIES in all, while a rank is killed by a signal. CI saw both groups of one run
    abort at start (SIGABRT, "terminate called without an active exception") and pass when
    run again, and a local full run saw two aborts in a row (2026-12-02): gloo's TCP
    transport aborts on a connection it cannot name (pytorch/gloo#514), as a stray
    connection to the port can make. A rank that fails with an exception, or an abort on
    every try, fails the test."""
    import time

    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessExitedException

    from flashlane.parallel.group import free_port

    for attempt in range(SPAWN_TRIES):
        try:
            mp.spawn(fn, args=(size, free_port(), *args), nprocs=size, join=True)
            return
        except ProcessExitedException as err:
            if err.signal_name is None or attempt + 1 == SPAWN_TRIES:
                raise
            time.sleep(1.0)  # let the aborted ranks' sockets close
