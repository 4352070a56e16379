"""`flashlane bench serve`'s report: each level's statistics (vLLM's conventions, see
serve.py), the table and the plot."""

from __future__ import annotations

import statistics
from typing import Any

from flashlane.bench.client import Result


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "median": 0.0, "p99": 0.0}
    ordered = sorted(values)
    # numpy's default (linear) percentile, as vLLM reports it
    pos = 0.99 * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    p99 = ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
    ms = 1000.0
    return {
        "mean": statistics.fmean(values) * ms,
        "median": statistics.median(values) * ms,
        "p99": p99 * ms,
    }


def summarize(concurrency: int, results: list[Result], duration: float) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    output = sum(r.output_tokens for r in ok)
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    return {
        "concurrency": concurrency,
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "duration_s": duration,
        "output_tokens": output,
        "output_tok_s": output / duration if duration > 0 else 0.0,
        "requests_s": len(ok) / duration if duration > 0 else 0.0,
        "ttft_ms": stats([r.ttft for r in ok]),
        "tpot_ms": stats(tpot),
        "itl_ms": stats([gap for r in ok for gap in r.itl]),
        "e2e_ms": stats([r.e2e for r in ok]),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    head = (
        f"{'conc':>5} {'ok':>5} {'err':>4} {'out tok/s':>10} {'req/s':>7} {'TTFT ms':>9} "
        f"{'p99':>8} {'TPOT ms':>8} {'ITL ms':>8} {'p99':>8} {'E2E ms':>9} {'alone':>6}"
    )
    print(head)
    for r in rows:
        alone = r.get("alone_mismatches")
        print(
            f"{r['concurrency']:>5} {r['completed']:>5} {r['errors']:>4} "
            f"{r['output_tok_s']:>10.1f} {r['requests_s']:>7.2f} {r['ttft_ms']['median']:>9.1f} "
            f"{r['ttft_ms']['p99']:>8.1f} {r['tpot_ms']['median']:>8.2f} "
            f"{r['itl_ms']['median']:>8.2f} {r['itl_ms']['p99']:>8.2f} "
            f"{r['e2e_ms']['median']:>9.1f} "
            f"{'-' if alone is None else ('ok' if alone == 0 else alone):>6}"
        )
    print("(medians unless marked p99; TPOT = (E2E - TTFT)/(tokens - 1), ITL per chunk)")
    for r in rows:
        for d in r.get("alone_differ", []):
            print(f"concurrency {r['concurrency']}: differs from alone: {d}")


def plot(rows: list[dict[str, Any]], path: str) -> bool:
    """tok/s against concurrency as a PNG; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot([r["concurrency"] for r in rows], [r["output_tok_s"] for r in rows], marker="o")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tokens / s")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
