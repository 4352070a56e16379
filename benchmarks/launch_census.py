"""Kernel launches of one lone decode step, by the flashlane function that issues them: a
CPU tool (issue 9). The CUDA kernel set runs on the CPU through Triton's interpreter; each
Triton launch and each torch op that would launch a kernel on a GPU (views excluded) counts
once, under the innermost flashlane function on the call stack.

    python benchmarks/launch_census.py --config flashnext-tiny [--depth K | --absorb B]
    python benchmarks/launch_census.py --prompts 1 --host     # the host's own time

--absorb B counts instead what a drafted lone call's load launches (issue 28): the MTP head
absorbing B streams' waiting prompt cells in one forward (MtpDrafter.absorb_waiting); --prompts
B a shared round of B short whole prompts (ModelBackend.verify). Ops on host tensors (Rows.of's
index lists) are left out.

The count is what a CUDA graph of the step holds, not a time: a graph replays each launch
in 1-3 us however small its work.

--host times the same work on the host with every Triton launch made a no-op (the kernels'
outputs are left unwritten): what flashlane's Python and torch's dispatch cost around the
launches, which an eager round (a prompt round, a drafted call's load) pays on a GPU per
launch beside Triton's launcher and the driver's. Median of --repeats, then the functions
with the most host time of their own (cProfile; its own cost inflates each call).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from triton.runtime import interpreter

from flashlane.kernels.gpu import TRITON
from flashlane.models.presets import preset
from flashlane.models.random_weights import build_random
from flashlane.models.state import SessionState
from flashlane.runner import lone

# ops that make no kernel on a GPU
NO_LAUNCH = {
    "view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "select", "slice", "as_strided",
    "t", "transpose", "permute", "expand", "unflatten", "flatten", "detach", "alias", "split",
    "split_with_sizes", "chunk", "unbind", "narrow", "empty", "empty_like", "empty_strided",
    "_reshape_alias", "lift_fresh", "view_as", "is_same_size", "diagonal", "promote_types",
    "new_empty",
}  # fmt: skip


def caller() -> str:
    """The innermost flashlane function on the stack, as path:function."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if "/flashlane/" in path:
            return path.split("/flashlane/")[-1] + ":" + frame.f_code.co_name
        frame = frame.f_back
    return "?"


class Census(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.in_triton = False
        census = self
        original = interpreter.InterpretedFunction.run

        def run(fn, *args, **kwargs):  # a Triton launch; its interpreted body is not counted
            if census.in_triton:
                return original(fn, *args, **kwargs)
            census.counts[(caller(), "triton " + fn.fn.__name__)] += 1
            census.in_triton = True
            try:
                return original(fn, *args, **kwargs)
            finally:
                census.in_triton = False

        self.original, self.run = original, run

    def __enter__(self):
        interpreter.InterpretedFunction.run = self.run
        return super().__enter__()

    def __exit__(self, *exc):
        interpreter.InterpretedFunction.run = self.original
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name not in NO_LAUNCH and not self.in_triton:
            self.counts[(caller(), "aten " + name)] += 1
        return func(*args, **(kwargs or {}))


def plain_step(cfg, model):
    """One session's plain lone step, as the engine's first graph runs it."""
    s = [SessionState.empty(cfg, 256, torch.float32, torch.float32, "cpu")]
    tok, pos = torch.tensor([5]), torch.tensor([0])
    out, k = torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, dtype=torch.long)
    rows = torch.zeros(4, 1, cfg.hc_count * cfg.hidden_size)
    return lambda: lone.step(model, s, tok, pos, out, (rows, k))


def drafted_step(cfg, model, depth: int):
    """One session's drafted lone step of `depth` drafts, named by size tables as its graph
    names it (runner/lone_draft.py)."""
    from flashlane.runner.draft_step import DraftBuffers
    from flashlane.runner.lone_buffers import SizeTables

    s = [SessionState.empty(cfg, 256, torch.float32, torch.float32, "cpu")]
    sizes = SizeTables(cfg, s, 8 * (depth + 1), torch.device("cpu"))
    width = cfg.hc_count * cfg.hidden_size
    io = DraftBuffers(1, depth, cfg.hc_count, width, torch.float32, torch.device("cpu"))
    io.table, io.table_keys = sizes.of((0,), 1, depth).clone(), sizes.draft_keys
    io.tok.fill_(5)
    return lambda: io.step(model, [sizes.anchor], io.tables())


# callers whose ops work on host tensors only (no launch on a GPU)
HOST = {"models/rows.py:of"}


def prompted(cfg, model, streams: int, prompt_len: int = 5):
    """B fresh sessions, a shared-round backend over them and B short whole prompts' windows."""
    from flashlane.lanes.records import Draws, Window
    from flashlane.request import SamplingParams
    from flashlane.runner.backend import ModelBackend

    n = max(256, 2 * prompt_len)
    s = [SessionState.empty(cfg, n, torch.float32, torch.float32, "cpu") for _ in range(streams)]
    backend = ModelBackend(model, s, max_rows=64, mtp_confidence=0.0)
    params = SamplingParams(temperature=0.0, max_tokens=8, draft=True)
    prompts = [[(7 * i + j) % 200 + 3 for j in range(prompt_len)] for i in range(streams)]
    windows = [
        Window(i, i, 0, tuple(p), Draws(params, 0, p, []), "prompt", True)
        for i, p in enumerate(prompts)
    ]
    return s, backend, windows


def absorb(cfg, model, streams: int):
    """B streams' prompts kept through a shared round, their MTP cells left waiting; the call
    absorbs them all, as a drafted lone call's load does."""
    s, backend, windows = prompted(cfg, model, streams)
    backend.verify(windows)
    backend.keep({w.stream_id: len(w.tokens) for w in windows})
    ids = list(range(streams))
    return lambda: backend.drafter.absorb_waiting(ids, dict(enumerate(s)), [5] * streams)


def prompt_round(cfg, model, streams: int, prompt_len: int = 5):
    """The shared round of B prompts of prompt_len tokens, after a first round on other
    sessions (so the process's one-time tensors are made before the count)."""
    _, warm, windows = prompted(cfg, model, streams, prompt_len)
    warm.verify(windows)
    _, backend, windows = prompted(cfg, model, streams, prompt_len)
    return lambda: backend.verify(windows)


def host_time(runs: list) -> None:
    """--host: each run once (fresh work each) with Triton's launches as no-ops, the last
    under cProfile."""
    torch.set_num_threads(1)
    original = interpreter.InterpretedFunction.run
    interpreter.InterpretedFunction.run = lambda fn, *args, **kwargs: None
    try:
        ms = []
        for run in runs[:-1]:
            t = time.perf_counter()
            run()
            ms.append(1e3 * (time.perf_counter() - t))
        pr = cProfile.Profile()
        pr.enable()
        runs[-1]()
        pr.disable()
    finally:
        interpreter.InterpretedFunction.run = original
    print(
        f"host: {statistics.median(ms):.2f} ms (median of {len(ms)}, "
        f"{min(ms):.2f}-{max(ms):.2f}) with Triton's launches as no-ops"
    )
    own = [
        (nc, tt, ct, f"{path.rsplit('/flashlane/', 1)[-1]}:{name}")
        for (path, _, name), (_, nc, tt, ct, _) in pstats.Stats(pr).stats.items()
        if "/flashlane/" in path
    ]
    print("  own ms  cumul ms  calls  flashlane function (under cProfile)")
    for nc, tt, ct, name in sorted(own, key=lambda r: -r[1])[:20]:
        print(f"{1e3 * tt:8.2f}  {1e3 * ct:8.2f}  {nc:5d}  {name}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="flashnext-tiny")
    ap.add_argument("--depth", type=int, default=0, help="a drafted step's (default: plain)")
    ap.add_argument(
        "--absorb",
        type=int,
        default=0,
        help="streams whose cells the MTP head absorbs (default: 0)",
    )
    ap.add_argument(
        "--prompts", type=int, default=0, help="short prompts a round takes (default: 0)"
    )
    ap.add_argument("--prompt-len", type=int, default=5, help="--prompts' tokens each")
    ap.add_argument("--host", action="store_true", help="time the host's own work (default: count)")
    ap.add_argument("--repeats", type=int, default=7, help="--host's timed runs (default: 7)")
    args = ap.parse_args()
    cfg, model = build_random(preset(args.config), torch.float32, "cpu", 0)
    model.use_kernels(TRITON)

    def work():
        if args.absorb:
            return absorb(cfg, model, args.absorb)
        if args.prompts:
            return prompt_round(cfg, model, args.prompts, args.prompt_len)
        run = drafted_step(cfg, model, args.depth) if args.depth else plain_step(cfg, model)
        run()  # the first step may take other branches
        return run

    if args.host:
        return host_time([work() for _ in range(args.repeats + 1)])
    run = work()
    census = Census()
    with census:
        run()
    where: collections.Counter = collections.Counter()
    for (fn, _), n in census.counts.items():
        if fn not in HOST:
            where[fn] += n
    total = sum(where.values())
    kind = f"drafted lone step (depth {args.depth})" if args.depth else "lone step"
    if args.absorb:
        kind = f"load: the MTP head absorbing {args.absorb} streams' waiting cells"
    if args.prompts:
        kind = f"shared round of {args.prompts} prompts of {args.prompt_len} tokens"
    print(f"{args.config}: {total} launches a {kind} ({len(model.layers)} layers)")
    for fn, n in where.most_common():
        ops = sorted(
            ((op, c) for (f, op), c in census.counts.items() if f == fn), key=lambda x: -x[1]
        )
        print(f"{n:5d}  {fn}: " + ", ".join(f"{op} x{c}" for op, c in ops))


if __name__ == "__main__":
    main()
