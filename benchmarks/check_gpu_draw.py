"""10,000 full-width random rows (248,320 ids, mixed params): the GPU keyed draw against the
CPU path, whose side runs in a pool of 14 processes (tests/sampling/test_gpu_draw.py has the
same check in one process: many minutes). Without CUDA it checks 100 rows of 5,000 ids.

    python benchmarks/check_gpu_draw.py        # how many rows differ (must be 0); exit 1 if any
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

sys.path.insert(0, ".")
from flashlane.sampling.choose import SampleError, draw_rows
from flashlane.sampling.gpu import draw_rows_gpu
from tests.sampling.rows import random_rows, random_spec

BATCH = 50


def comparable(draws: list) -> list:
    """Tokens as they are, errors as their messages."""
    return [str(d) if isinstance(d, SampleError) else d for d in draws]


def on_cpu(job: tuple) -> list:
    logits, specs = job
    torch.set_num_threads(1)
    return comparable(draw_rows(logits, specs))


def main() -> int:
    t = time.perf_counter()
    cuda = torch.cuda.is_available()
    dev, num_rows, vocab = ("cuda", 10_000, 248_320) if cuda else ("cpu", 100, 5_000)
    rng = np.random.default_rng(2)
    gen = torch.Generator(device=dev).manual_seed(2)
    gpu, cpu = [], []
    with ProcessPoolExecutor(14) as pool:
        for _ in range(num_rows // BATCH):
            logits = random_rows(gen, BATCH, vocab)
            specs = [random_spec(rng, vocab) for _ in range(BATCH)]
            gpu += comparable(draw_rows_gpu(logits, specs))
            cpu.append(pool.submit(on_cpu, (logits.cpu(), specs)))
        want = [d for job in cpu for d in job.result()]
    bad = sum(g != w for g, w in zip(gpu, want))
    errors = sum(isinstance(w, str) for w in want)
    print(
        f"{num_rows} rows of {vocab} ids on {dev}: {bad} differ from the CPU path "
        f"({errors} error rows), {time.perf_counter() - t:.0f} s"
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
