"""The processes of a tensor-parallel engine: one per device, rank 0 the caller.

Under torchrun (one node or several: `--nnodes --rdzv-backend c10d --rdzv-endpoint`), every
process runs the same command; rank 0 goes on to serve or generate, and the others become
replay workers here and exit when rank 0 is done. Started plainly (`flashlane serve
--tensor-parallel-size N`, `LLM(tensor_parallel_size=N)`), rank 0 spawns ranks 1..N-1 itself
on 127.0.0.1 with a free port.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys

import torch.distributed as dist
import torch.multiprocessing as mp

from flashlane.config import EngineConfig
from flashlane.parallel.group import TensorParallel, free_port, in_torchrun, join, leave

logger = logging.getLogger("flashlane")


def start(config: EngineConfig, device: str, engine: type) -> TensorParallel:
    """The group of config.tensor_parallel_size ranks, joined as rank 0 (a torchrun rank past
    0 serves as a worker here and exits). `device`: the engine's resolved device; `engine`:
    the engine class a worker builds (engine.Engine, handed in: this package sits below it)."""
    size = config.tensor_parallel_size
    if device.startswith("cuda:"):
        raise ValueError(f"--tensor-parallel-size {size}: give --device cuda, not {device}")
    if in_torchrun():
        tp = join(device, size)
        if not tp.is_leader:
            run_worker(config, tp, engine)
            leave()
            sys.exit(0)
        atexit.register(leave)
        return tp
    if dist.is_initialized():
        raise ValueError(
            f"--tensor-parallel-size {size}: this process already belongs to a process group "
            "(one tensor-parallel engine per process)"
        )
    port = free_port()
    context = mp.get_context("spawn")
    procs = [
        context.Process(
            target=_spawned, args=(config, rank, size, port, device, engine), daemon=True
        )
        for rank in range(1, size)
    ]
    for p in procs:
        p.start()
    tp = join(device, size, 0, port)
    atexit.register(_stop, procs)
    return tp


def run_worker(config: EngineConfig, tp: TensorParallel, engine: type) -> None:
    """A rank past 0: the engine's model and backend (no host), replaying rank 0's calls."""
    from flashlane.parallel.replay import serve

    built = engine(config, log=lambda *_: None, tp=tp)
    serve(built.backend, tp)


def _spawned(
    config: EngineConfig, rank: int, size: int, port: int, device: str, engine: type
) -> None:
    if device == "cpu":
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    tp = join(device, size, rank, port)
    try:
        run_worker(config, tp, engine)
    finally:
        leave()


def _stop(procs: list) -> None:
    """At rank 0's exit: the workers end with it (daemons: killed if they hang)."""
    for p in procs:
        p.join(timeout=30)
    leave()
