"""A simulated 2-node start: two torchrun launches of one process each, meeting at a c10d
rendezvous on 127.0.0.1 (what two machines would do with --rdzv-endpoint HOST:PORT). The
rendezvous picks which launch is rank 0: exactly one of them prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashlane import LLM, SamplingParams
from flashlane.parallel.group import free_port

ROOT = Path(__file__).resolve().parents[2]
NODE = str(Path(__file__).with_name("nodes.py"))


def two_nodes(*args: str, timeout: float = 240) -> list[str]:
    """Both launches' stdout (each checked to exit 0)."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--rdzv-id", f"flashlane-{port}", NODE, *args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            assert p.returncode == 0, err.decode()[-3000:]
            outs.append(out.decode())
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return outs


def leader_json(outs: list[str]) -> dict:
    printed = [o for o in outs if o.strip()]
    assert len(printed) == 1, outs  # rank 0 alone prints
    return json.loads(printed[0].strip().splitlines()[-1])


def test_two_node_start_joins_one_group():
    got = leader_json(two_nodes("--check-group"))
    assert got["sum"] == [[3.0] * 3] * 2
    assert got["side"] == [[1.0] * 3 + [2.0] * 3] * 2
    assert got["said"] == {"from": 0}


@pytest.mark.slow
def test_two_node_generate_equals_one_rank():
    flags = ["--max-tokens", "12", "--temperature", "0", "--parallel", "2", "--context", "256"]
    got = leader_json(
        two_nodes("generate", "--prompt", "def add(a, b):", "--json", "--unpriced",
                  "--tensor-parallel-size", "2", *flags)
    )  # fmt: skip
    one = LLM(parallel=2, context=256, unpriced=True).generate(
        "def add(a, b):", SamplingParams(max_tokens=12, temperature=0)
    )[0]
    assert (got["text"], got["token_ids"]) == (one.text, one.token_ids)
