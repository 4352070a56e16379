"""What the benchmarks share: the commit measured, random prompts, a device sync, a CUDA timer,
flat costs."""

from __future__ import annotations

import os
import subprocess

import torch

from flashlane.lanes.records import CostTable

# drafting priced flat: benchmarks that time rounds draft nothing unless asked
FLAT_COSTS = CostTable({1: 1.0, 64: 1.0}, draft_step_ms=1.0, overhead_ms=0.0)


def commit() -> str:
    """The code measured: FLASHLANE_COMMIT (the GPU machine gets a copy without .git), else
    git's short HEAD, else "unknown"."""
    if os.environ.get("FLASHLANE_COMMIT"):
        return os.environ["FLASHLANE_COMMIT"]
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def random_prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (length,), generator=g).tolist() for _ in range(n)]


def sync(device) -> None:
    """Wait for the device's queued work (nothing to wait for on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def graph_timed(fn, reps: int, calls: int = 10) -> float:
    """The median seconds of one call of fn replayed from a CUDA graph of `calls` calls (as the
    engine's graphed steps run it: no host launch time), over `reps` replays."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # compiles and warms outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return cuda_timed(graph.replay, reps) / calls


def cuda_timed(fn, reps: int) -> float:
    """The median seconds of `reps` calls of fn on the GPU, each between two CUDA events,
    after one untimed call."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return sorted(times)[len(times) // 2]
