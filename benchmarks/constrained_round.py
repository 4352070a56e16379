"""What constrained decoding costs a shared round on the CPU: 16 streams of the embedded model
decoding together, every stream free, or every stream under a grammar (a JSON schema, a
regex), drafts off so every round has the same shape (16 rows, one per stream).

    python benchmarks/constrained_round.py [--streams 16] [--rounds 40] [--repeats 3]

A round is one host.run_once once every stream decodes (prefill rounds left out); the mask
column is the time inside the backend's _constrain (the grammar's masks and the -inf fill),
which an unconstrained round never enters. A masked row also draws faster on the CPU (the
keyed draw prunes -inf ids), so the round column can come out below the free one; the mask
column is the cost the grammar adds. The grammars never let a reply end inside the
measured rounds (a long array, a long regex), so every round keeps 16 streams. Configs run
interleaved, --repeats times; the table gives medians. Ends with one JSON line.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import time
from datetime import date
from statistics import median

import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.request import SamplingParams, StructuredOutput

COSTS = CostTable({1: 1.0, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)
PROMPT = "def totals(rows):\n    return "
LONG_JSON = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 8}},
        "required": ["id", "name"],
        "additionalProperties": False,
    },
    "minItems": 400,
}
CONFIGS = {
    "free": None,
    "json_schema": StructuredOutput(json=json.dumps(LONG_JSON)),
    "regex": StructuredOutput(regex=r"[a-z_]{1,12}(, [a-z_]{1,12}){300,}"),
}


def run(llm: LLM, structured, streams: int, rounds: int) -> dict:
    host, backend = llm.engine.host, llm.engine.backend
    masked = [0.0]
    constrain = type(backend)._constrain

    def timed_constrain(self, windows, logits):
        t0 = time.perf_counter()
        try:
            return constrain(self, windows, logits)
        finally:
            masked[0] += time.perf_counter() - t0

    backend._constrain = timed_constrain.__get__(backend)
    try:
        for i in range(streams):
            params = SamplingParams(
                max_tokens=rounds + 8, temperature=0.8, seed=i, draft=False, structured=structured
            )
            host.submit(f"bench-{time.monotonic_ns()}-{i}", llm.engine.encode(PROMPT), params)
        times, masks = [], []
        while host.has_work:
            decoding = host.live and all(not s.is_filling for s in host.live)
            full = decoding and len(host.live) == streams and not host.waiting
            masked[0] = 0.0
            t0 = time.perf_counter()
            host.run_once()
            if full and len(times) < rounds:
                times.append(time.perf_counter() - t0)
                masks.append(masked[0])
    finally:
        del backend._constrain
    return {"round_ms": median(times) * 1e3, "mask_ms": median(masks) * 1e3, "rounds": len(times)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    llm = LLM(None, costs=COSTS, parallel=args.streams, max_rows=args.streams, drafts=False)
    for structured in CONFIGS.values():  # warm-up: first-call costs out of the table
        run(llm, structured, args.streams, 4)
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for _ in range(args.repeats):
        for name, structured in CONFIGS.items():
            results[name].append(run(llm, structured, args.streams, args.rounds))
    base = median(r["round_ms"] for r in results["free"])
    rows = {}
    head = f"{'config':<12} {'round ms':>9} {'mask ms':>8} {'mask/free':>9} {'vs free':>8}"
    print(f"{head}  (median of {args.repeats})")
    for name, runs in results.items():
        round_ms = median(r["round_ms"] for r in runs)
        mask_ms = median(r["mask_ms"] for r in runs)
        rows[name] = {
            "round_ms": round(round_ms, 3),
            "mask_ms": round(mask_ms, 3),
            "vs_free": round(round_ms / base, 4),
            "mask_share_of_free_round": round(mask_ms / base, 4),
            "runs": runs,
        }
        share = f"{mask_ms / base:9.2%}"
        print(f"{name:<12} {round_ms:9.2f} {mask_ms:8.3f} {share} {round_ms / base:8.3f}")
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        json.dumps(
            {
                "bench": "constrained_round",
                "date": date.today().isoformat(),
                "commit": commit,
                "device": f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)",
                "command": "python benchmarks/constrained_round.py "
                f"--streams {args.streams} --rounds {args.rounds} --repeats {args.repeats}",
                "streams": args.streams,
                "rounds": args.rounds,
                "configs": rows,
            }
        )
    )


if __name__ == "__main__":
    main()
