"""Aggregate decode tokens/s of shared rounds on the CPU: 1..16 concurrent streams against the
same requests served one at a time, drafts on and off.

    python benchmarks/bench_lanes_cpu.py [--model DIR] [--concurrency 1,2,4,8,16] [--tokens 64]

Without --model it uses the embedded default model. Prompts are held-out-like snippets (real
text for a trained model) or random ids; every reply is greedy, so the drafted and shared runs
must equal the serial ones (checked). Drafts off and on run interleaved, --repeats pairs per
stream count; the table gives medians and the spread of the on/off ratio over the pairs. Ends
with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from datetime import date
from statistics import median

import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.request import SamplingParams
from flashlane.runner.heap import freeze_heap

PROMPTS = [
    "def fibonacci(n):\n",
    "class LRUCache:\n    def __init__(self, capacity):\n",
    "import os\n\n\ndef walk(path):\n",
    '"""Parse a configuration file."""\n\n',
    "    for key, value in sorted(items):\n",
    "def read_lines(path, encoding='utf-8'):\n",
    "# Copyright 2001 Python Software Foundation\n",
    "    raise ValueError(f'bad value: {value!r}')\n",
]


def prompts(llm: LLM, n: int) -> list[list[int]]:
    if llm.tokenizer is not None:
        base = [llm.engine.encode(p) for p in PROMPTS]
    else:
        g = torch.Generator().manual_seed(0)
        vocab = llm.engine.model_config.vocab_size
        base = [torch.randint(3, vocab, (12 + 5 * i,), generator=g).tolist() for i in range(8)]
    return [base[i % len(base)] + base[(i + 1) % len(base)][:i] for i in range(n)]


def run(llm: LLM, batch: list[list[int]], params: SamplingParams) -> tuple[float, list]:
    t0 = time.perf_counter()
    outs = llm.generate(batch, params)
    return time.perf_counter() - t0, outs


def drafting_counts(llm: LLM) -> dict[str, int]:
    """The lone driver's drafting counters (runner/lone_draft.Drafting), cumulative; {}
    where there is no lone driver or it does not draft."""
    drafting = getattr(getattr(llm.engine.host, "lone", None), "drafting", None)
    if drafting is None:
        return {}
    names = ("num_calls", "num_drafted", "num_landed", "num_carried")
    return {n: getattr(drafting, n) for n in names}


def widen_graphs(llm: LLM, rows: int | None) -> None:
    """An experiment, not the engine's default: the rounds' row-count-only parts replay CUDA
    graphs up to `rows` rows (the engine captures up to 64: a round of several prompts past
    it runs its parts eagerly, host-bound on a small model), every bucket captured now."""
    model = llm.engine.model
    if rows is None or getattr(model, "graphs", None) is None:
        return
    from flashlane.runner.graphs import Graphs, capture_all

    model.graphs = Graphs(max_rows=rows, log=model.graphs.log)
    secs, used = capture_all(model, model.graphs)
    print(f"graphed parts up to {rows} rows: {len(model.graphs.entries)} graphs, {secs:.1f} s, "
          f"{used / 2**20:.0f} MiB, failed: {model.graphs.failed}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the Triton kernels there)")
    ap.add_argument("--graph-rows", type=int, default=None, help="an experiment: widen_graphs")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = [int(c) for c in args.concurrency.split(",")]
    llm = LLM(args.model, parallel=max(levels), device=args.device)
    widen_graphs(llm, args.graph_rows)
    frozen = args.device.startswith("cuda")
    if frozen:  # as `flashlane serve` on a GPU (runner/heap.py): no full collection walks
        freeze_heap()  # the engine's objects in a timed pass (one took 183 ms, a9a8031)
    costs: CostTable = llm.engine.backend.costs()
    on = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    off = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True, draft=False)
    rows, exact = [], True
    for n in levels:
        batch = prompts(llm, n)
        serial_s, serial_outs = 0.0, []
        for p in batch:
            dt, o = run(llm, [p], off)
            serial_s += dt
            serial_outs += o
        toks = sum(len(o.token_ids) for o in serial_outs)
        # one untimed pass of each first: on a GPU the first rounds of a new shape compile
        # Triton kernels and capture graphs (seen: 4 streams, drafts off, 61 tok/s, then 390)
        for params in (off, on):
            run(llm, batch, params)
        # Off and on interleaved, pair by pair: a busy stretch of a shared machine then lands
        # on both sides of a pair, and each pair gives one on/off ratio. The order flips
        # every pair, so whatever the second run of a pair gains or loses falls on both.
        rates: dict[str, list[float]] = {"off": [], "on": []}
        drafted = accepted = 0
        split = {"off": [0.0, 0.0], "on": [0.0, 0.0]}  # s in prefill, s in decode, summed
        before = drafting_counts(llm)
        for i in range(args.repeats):
            pair = (("off", off), ("on", on))
            for name, params in pair if i % 2 == 0 else pair[::-1]:
                dt, outs = run(llm, batch, params)
                rates[name].append(toks / dt)
                exact &= all(a.token_ids == b.token_ids for a, b in zip(outs, serial_outs))
                split[name][0] += sum(o.stats.prefill_seconds for o in outs)
                split[name][1] += sum(o.stats.decode_seconds for o in outs)
                if name == "on":
                    drafted += sum(o.stats.drafted for o in outs)
                    accepted += sum(o.stats.accepted for o in outs)
        ratios = sorted(a / b for a, b in zip(rates["on"], rates["off"]))
        # the lone driver's measured ms a step by (sessions, drafts a step) and ms a call
        # spends before its first step, which its depth rule prices: why a level drafted
        lone = getattr(llm.engine.host, "lone", None)
        measured = {
            name: {f"{b},{d}": round(ms, 4) for (b, d), ms in sorted(table.items())}
            for name in ("step_ms", "load_ms")
            if (table := getattr(lone, name, None)) is not None
        }
        rows.append(
            {
                "streams": n,
                "serial_tok_s": toks / serial_s,
                "shared_off_tok_s": median(rates["off"]),
                "shared_on_tok_s": median(rates["on"]),
                "on_over_off": median(ratios),
                "on_over_off_min": ratios[0],
                "on_over_off_max": ratios[-1],
                "on_over_off_runs": ratios,
                "drafted": drafted,
                "accepted": accepted,
                "lone_ms": measured,
                # why a level drafted or not: the lone driver's drafted calls over its calls
                # (this level's), and where a reply's time went (ms a reply, its runs' mean)
                "lone_drafting": {k: v - before.get(k, 0) for k, v in drafting_counts(llm).items()},
                "reply_ms": {
                    k: {
                        "prefill": 1e3 * p / (n * args.repeats),
                        "decode": 1e3 * d / (n * args.repeats),
                    }
                    for k, (p, d) in split.items()
                },
            }
        )
    one = rows[0]["shared_off_tok_s"]
    # a capture that failed: the lone steps ran eagerly, not the product's figures (1a68afd)
    failed = getattr(getattr(llm.engine.host, "lone", None), "failed", None)
    print(
        f"{'streams':>7} {'serial':>8} {'off':>8} {'on':>8} {'on/off':>7} {'min-max':>11} "
        f"{'x one':>6} {'accept':>7}"
    )
    for r in rows:
        r["off_over_one_stream"] = r["shared_off_tok_s"] / one
        acc = r["accepted"] / r["drafted"] if r["drafted"] else 0.0
        spread = f"{r['on_over_off_min']:.2f}-{r['on_over_off_max']:.2f}"
        print(
            f"{r['streams']:>7} {r['serial_tok_s']:>8.1f} {r['shared_off_tok_s']:>8.1f} "
            f"{r['shared_on_tok_s']:>8.1f} {r['on_over_off']:>7.2f} {spread:>11} "
            f"{r['off_over_one_stream']:>6.2f} {acc:>7.2f}"
        )
    # the GPU machine's copy has no .git of its own: FLASHLANE_COMMIT names the code there
    commit = (
        os.environ.get("FLASHLANE_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
    )
    print(
        json.dumps(
            {
                "bench": "lanes_cpu",
                "date": str(date.today()),
                "commit": commit,
                "device": torch.cuda.get_device_name()
                if args.device.startswith("cuda")
                else f"cpu ({platform.processor() or platform.machine()}, "
                f"{torch.get_num_threads()} threads)",
                "model": str(llm.config.model_path),
                "tokens": args.tokens,
                "costs_ms": costs.verify_ms,
                "exact": exact,
                "heap_frozen": frozen,
                "lone_failed": failed,
                "rows": rows,
                "command": "python benchmarks/bench_lanes_cpu.py "
                + " ".join(f"--{k} {v}" for k, v in vars(args).items() if v is not None),
            }
        )
    )
    if failed:
        raise SystemExit(f"bench_lanes_cpu: the lone driver's captures failed: {failed}")


if __name__ == "__main__":
    main()
