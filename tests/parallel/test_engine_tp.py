"""`flashlane generate --tensor-parallel-size 2` on the embedded model: rank 0 spawns rank 1 on
127.0.0.1 (gloo), keeps the lane core, and rank 1 replays each round; the text and tokens are
TP=1's, drafts on (MTP and copy), seeded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashlane import LLM, SamplingParams

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "def add(a, b):"
SEEDED = ["--temperature", "0.8", "--top-p", "0.95", "--seed", "7"]


def generate(*flags: str) -> dict:
    """`flashlane generate --json` in a fresh process (a group per process), this tree's code."""
    cmd = [
        sys.executable, "-c", "import sys; from flashlane.cli import main; sys.exit(main())",
        "generate", "--prompt", PROMPT, "--max-tokens", "16", "--json", "--unpriced",
        "--parallel", "2", "--context", "256", *flags,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def one_rank(params: SamplingParams) -> tuple[str, list[int]]:
    llm = LLM(parallel=2, context=256, unpriced=True)
    out = llm.generate(PROMPT, params)[0]
    return out.text, out.token_ids


def test_generate_on_two_ranks_gives_one_ranks_text():
    two = generate("--tensor-parallel-size", "2", *SEEDED)
    params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=7)
    assert (two["text"], two["token_ids"]) == one_rank(params)
    assert two["stats"]["drafted"] > 0  # the drafted rounds were replayed too


@pytest.mark.slow
def test_generate_greedy_on_two_ranks():
    two = generate("--tensor-parallel-size", "2", "--temperature", "0")
    assert (two["text"], two["token_ids"]) == one_rank(SamplingParams(max_tokens=16, temperature=0))


def test_a_size_that_does_not_divide_the_heads_is_refused_by_name():
    cmd = [
        sys.executable, "-c", "import sys; from flashlane.cli import main; sys.exit(main())",
        "generate", "--prompt", PROMPT, "--max-tokens", "2", "--tensor-parallel-size", "3",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "tensor-parallel size 3 does not divide" in done.stderr
    assert "attention heads (num_attention_heads) 4" in done.stderr


@pytest.mark.slow
def test_two_ranks_alone_batched_and_drafted_equal_one_rank():
    def run(size: int) -> dict:
        cmd = [sys.executable, str(Path(__file__).with_name("engine_replies.py")), str(size)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    two, one = run(2), run(1)
    assert two["together"] == two["alone"]  # at TP=2: batched and drafted == alone, undrafted
    assert two["cached"] > 0  # the prompt cache's keep_state and resume were replayed
    assert two == one
