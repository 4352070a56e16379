"""Issue 26's shape sweep: seeded random small qwen4_exp configs (tests/sweep_configs.py),
each served every way (tests/sweep_gates.py: alone, batched with 2 and 15 others, drafted or
not, fresh or resumed, moved or paused; greedy and seeded), replies compared token for token.

    python benchmarks/shape_sweep.py --device cuda [--configs 20] [--jobs 4] [--json F]
    python benchmarks/shape_sweep.py --device cuda --siblings [--configs 24]   # issue 33

--siblings sweeps tests/sweep_configs.sibling_configs instead: Qwen3-Next, Qwen3.5-MoE and
Qwen3.5 dense shapes.

--jobs runs configs in that many processes at once (Triton compiles each config's kernels
on the CPU; the bits do not depend on it). Prints a table, ends with one JSON line; exits 1
if any reply differed or failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flashlane.bench import common as bench_common
from tests.oracle import build_oracle
from tests.sweep_configs import sibling_configs, sweep_configs
from tests.sweep_gates import check_replies

FIELDS = (
    "hc_count",
    "hc_lowrank",
    "hidden_size",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "num_experts",
    "num_experts_per_tok",
    "vocab_size",
)


def one(index: int, device: str, streams: int, siblings: bool = False) -> dict:
    spec = (sibling_configs if siblings else sweep_configs)(index + 1)[index]
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_oracle(Path(tmp), spec, seed=index)
        t0 = time.perf_counter()
        seen = check_replies(folder, device, spec["vocab_size"], num=streams)
    return dict(
        config=index,
        model_type=spec.get("model_type", "qwen4_exp_text"),
        # a sibling has no hyper-connections (one stream) and Qwen3.5 dense no experts
        **{k: spec.get(k, 1 if k == "hc_count" else 0) for k in FIELDS},
        **seen,
        seconds=round(time.perf_counter() - t0, 1),
    )


def in_process(index: int, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--device",
        args.device,
        "--streams",
        str(args.streams),
        "--only",
        str(index),
        *(["--siblings"] if args.siblings else []),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True)
    lines = run.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        return dict(
            config=index, compared=0, differ=0, errors=1, failure=(run.stderr or run.stdout)[-2000:]
        )
    return json.loads(lines[-1])["rows"][0]


def show(r: dict) -> dict:
    """Prints a config's row as it lands (a call cut short keeps the rows before it)."""
    if "failure" in r:
        print(f"{r['config']:>3} failed: {r['failure']}", flush=True)
        return r
    print(
        f"{r['config']:>3} {r['hc_count']:>3} {r['hidden_size']:>4} "
        f"{r['linear_key_head_dim']:>3}/{r['linear_value_head_dim']:<4} "
        f"{r['num_experts']:>3} top{r['num_experts_per_tok']} {r['vocab_size']:>6} "
        f"{r['compared']:>9} {r['differ']:>7} {r['moves']:>6} {r['cached_tokens']:>7} "
        f"{r['seconds']:>6.1f}",
        flush=True,
    )
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--configs", type=int, default=20)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--only", type=int, nargs="*", help="these config indices alone")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--siblings", action="store_true", help="the siblings' shapes (issue 33)")
    args = ap.parse_args()
    indices = args.only if args.only else list(range(args.configs))
    print(
        f"{'#':>3} {'hc':>3} {'H':>4} {'kv dims':>8} {'experts':>8} {'vocab':>6} "
        f"{'compared':>9} {'differ':>7} {'moves':>6} {'cached':>7} {'s':>6}",
        flush=True,
    )
    rows = []
    if args.jobs > 1:
        with ThreadPoolExecutor(args.jobs) as pool:
            for r in pool.map(lambda i: in_process(i, args), indices):
                rows.append(show(r))
    else:
        for i in indices:
            rows.append(show(one(i, args.device, args.streams, args.siblings)))
    commit = bench_common.commit()
    result = dict(
        bench="shape_sweep",
        device=args.device,
        date=datetime.date.today().isoformat(),
        commit=commit or None,
        command=" ".join(sys.argv),
        streams=args.streams,
        siblings=args.siblings,
        configs=[r["config"] for r in rows],
        compared=sum(r["compared"] for r in rows),
        differ=sum(r["differ"] for r in rows),
        errors=sum(r["errors"] for r in rows),
        rows=rows,
    )
    if args.device.startswith("cuda"):
        import torch

        result["gpu"] = torch.cuda.get_device_name()
        result["torch"] = torch.__version__
    line = json.dumps(result)
    if args.json:
        args.json.write_text(line + "\n")
    print(line)
    return 1 if result["differ"] or result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
