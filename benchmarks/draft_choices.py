"""Why a lone drafted call drafts or not: each of Drafting.choose's verdicts (runner/lone_draft.py)
with the prices it weighed, over bench_lanes_cpu.py's sequence (levels in order in one engine,
each a warm pass off and on, then off / on pairs). A GPU diagnostic of issue 28's drafting, and
on the CPU a replay of the rule at a GPU's costs: `--costs` takes the step and load ms a
bench_lanes_cpu.py JSON measured (its last level's `lone_ms`) and holds them fixed, so the
verdicts are those the rule gives at that card's costs on the embedded model's landing here
(the CPU attaches a lone driver with tests/runner/test_lone.py's `with_lone`; its own timings are not
the GPU's and would drive the rule elsewhere).

    PYTHONPATH=. python benchmarks/draft_choices.py --device cuda --streams 1,4,16
    PYTHONPATH=. python benchmarks/draft_choices.py --device cpu --streams 1,4,16 --pairs 5 \\
        --costs benchmarks/results/bench_lanes_cuda_h100_817e2e1_20261206T015310Z.json

Prints each pass's verdicts (kind, sessions, drafted steps to the slowest reply), then one
JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from bench_lanes_cpu import prompts

from flashlane.llm import LLM
from flashlane.request import SamplingParams
from tests.runner.test_lone import with_lone


class Fixed(dict):
    """A cost table the driver's folds do not move (the GPU's costs, replayed on the CPU)."""

    def __setitem__(self, key, value) -> None:
        pass


def held_costs(path: str) -> tuple[Fixed, Fixed]:
    """(step_ms, load_ms) by (sessions, depth) from a bench_lanes_cpu.py JSON's last level."""
    with open(path) as f:
        lone_ms = json.load(f)["rows"][-1]["lone_ms"]

    def table(name: str) -> Fixed:
        return Fixed({tuple(map(int, k.split(","))): v for k, v in lone_ms[name].items()})

    return table("step_ms"), table("load_ms")


def lone_llm(device: str, streams: int) -> tuple[LLM, object]:
    """The embedded model for `streams` sessions and its lone driver (on the CPU, one
    attached as tests attach one)."""
    llm = LLM(None, parallel=streams, device=device)
    host = llm.engine.host
    if host.lone is None:
        with_lone(llm, host.config.lone_steps, streams, llm.engine.backend.drafter)
    return llm, host.lone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--streams", default="1", help="levels in order (default 1), e.g. 1,4,16")
    ap.add_argument("--pairs", type=int, default=3, help="off / on pairs a level (default 3)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens a reply (default 64)")
    ap.add_argument("--costs", default=None, help="a bench JSON's costs, held (default: none)")
    args = ap.parse_args()
    levels = [int(n) for n in args.streams.split(",")]
    llm, drv = lone_llm(args.device, max(levels))
    if drv.drafting is None:
        raise SystemExit("draft_choices: no drafting lone driver here")
    if args.costs:
        drv.step_ms, drv.load_ms = held_costs(args.costs)
    d, log = drv.drafting, []
    inner = d.run

    def spy(ids, *rest, **kw):
        got = inner(ids, *rest, **kw)
        kind = "try" if d.probing else ("drafted" if got else "plain")
        why = dict(d.verdict)
        log.append({"b": len(ids), "kind": kind, **why})
        return got

    d.run = spy
    on = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    off = dataclasses.replace(on, draft=False)
    passes = []
    for n in levels:
        batch = prompts(llm, n)
        for name, params in [("warm off", off), ("warm on", on)] + [
            ("off", off),
            ("on", on),
        ] * args.pairs:
            before = len(log)
            llm.generate(batch, params)
            if params.draft:
                calls = log[before:]
                print(
                    f"{n:3d} {name:8s}", " ".join(f"{c['kind']}:{c.get('slowest')}" for c in calls)
                )
                passes.append({"streams": n, "pass": name, "calls": calls})
    print(json.dumps({"bench": "draft_choices", "costs": args.costs, "passes": passes}))


if __name__ == "__main__":
    main()
