"""The prompt cache on the GPU (Triton kernels, CUDA graphs, fla prefill where installed): a
resent prompt and a prompt extended by a turn give the fresh reply, tokens and logprobs."""

import dataclasses

import pytest
import torch

from flashlane.lanes.records import CostTable
from flashlane.llm import LLM
from flashlane.request import SamplingParams
from tests.oracle import GATE_CHECKPOINTS

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]
COSTS = CostTable({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4}, draft_step_ms=0.3, overhead_ms=0.2)


def ids(n, seed):
    return torch.randint(3, 500, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("draft", [True, False])
@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_tokens=12, temperature=0.0, logprobs=2),
        SamplingParams(max_tokens=12, temperature=0.9, top_p=0.95, seed=11, logprobs=2),
    ],
    ids=["greedy", "seeded"],
)
@pytest.mark.parametrize("name", GATE_CHECKPOINTS)
def test_resumed_replies_equal_fresh_on_the_gpu(oracle_by_name, name, params, draft):
    opts = dict(costs=COSTS, max_rows=16, device="cuda")
    fresh = LLM(str(oracle_by_name(name)), parallel=1, prompt_cache_gb=0, **opts)
    cached = LLM(str(oracle_by_name(name)), parallel=2, prompt_cache_gb=1, **opts)
    p = dataclasses.replace(params, draft=draft)
    prompt = ids(300, 1)
    longer = prompt + ids(90, 2)
    for text in (prompt, prompt, longer):
        got = cached.generate(text, p)[0]
        want = fresh.generate(text, dataclasses.replace(p, draft=False))[0]
        assert got.error is None and got.token_ids == want.token_ids
        assert got.logprobs == want.logprobs
    assert got.stats.cached_tokens > 0
    assert not cached.engine.backend.bound
