"""Expert parallel on two gloo ranks (processes on 127.0.0.1): each rank holds half the
experts whole (parallel/plan.py `placed`), the ranks' slot outputs are summed before the
slots are added (kernels.moe_placed), so the MoE blocks give one rank's bits; attention and
GDN heads are split as under tensor parallel, so the logits stay within TP's tolerance of one
rank, tokens equal, and at EP=2 alone, batched and drafted are the same bits."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flashlane.kernels import REFERENCE
from flashlane.kernels.moe import reference as moe_ref
from flashlane.models.config import ModelConfig
from flashlane.parallel.plan import ShardingError, shard_config
from flashlane.request import SamplingParams
from tests.parallel.ranks import replies, run_rank, spawn_ranks
from tests.parallel.test_engine_tp import SEEDED, generate, one_rank
from tests.parallel.test_sharded_model import TOLERANCE, _rel


@pytest.fixture(scope="module")
def placed(tiny_ckpt, tmp_path_factory):
    ckpt = str(tiny_ckpt)
    out = tmp_path_factory.mktemp("ep") / "rank0.pt"
    spawn_ranks(run_rank, 2, ckpt, str(out), True)
    return replies(ckpt, None), torch.load(out)


def test_expert_parallel_replies_equal_one_rank(placed):
    one, two = placed
    (experts, width), held = one["held"], two["held"]
    assert held == (experts // 2, width)  # half the experts, each whole
    for key in ("logits", "greedy_logits", "seeded_logits"):
        assert _rel(two[key], one[key]) <= TOLERANCE, key
    assert (two["greedy"], two["seeded"]) == (one["greedy"], one["seeded"])


def test_expert_parallel_alone_batched_and_drafted_are_the_same_bits(placed):
    _, two = placed
    assert torch.equal(two["batched"], two["logits"])
    assert torch.equal(two["other_batched"], two["other_alone"])
    assert torch.equal(two["drafted"], two["greedy_logits"])


def test_placed_slots_sum_to_one_ranks_bits():
    """The MoE alone: two halves of the experts, their slots summed, added as moe adds them:
    bit for bit one rank's moe (the kernel contract the ranks rely on)."""
    g = torch.Generator().manual_seed(0)
    n, h, i, e, k = 9, 16, 8, 6, 3
    x = torch.randn(n, h, generator=g, dtype=torch.float64)
    router = torch.randn(e, h, generator=g, dtype=torch.float64)
    gate, up = (torch.randn(e, i, h, generator=g, dtype=torch.float64) for _ in range(2))
    down = torch.randn(e, h, i, generator=g, dtype=torch.float64)
    shared = (
        torch.randn(n, 1, generator=g, dtype=torch.float64),
        torch.randn(n, h, generator=g, dtype=torch.float64),
    )
    want = moe_ref.moe(x, router, gate, up, down, k, True, shared)
    _, ids = moe_ref.route(x, router, k, True)
    halves = [
        moe_ref.expert_slots(x, ids, gate[a:b], up[a:b], down[a:b], a) for a, b in ((0, 3), (3, 6))
    ]
    assert all(h.abs().sum() > 0 for h in halves)  # both ranks hold experts the rows use

    def reduce(slots):
        return halves[0] + halves[1]

    got = REFERENCE.moe_placed(x, router, gate[:3], up[:3], down[:3], k, True, 0, reduce, shared)
    assert torch.equal(got, want)


def test_expert_parallel_needs_the_experts_to_divide(tiny_ckpt):
    cfg = ModelConfig.from_hf(tiny_ckpt / "config.json")
    odd = dataclasses.replace(cfg, num_experts=cfg.num_experts + 1)
    with pytest.raises(ShardingError, match=r"experts \(num_experts\)"):
        shard_config(odd, 2, placed=True)
    local = shard_config(cfg, 2, placed=True)
    assert local.moe_intermediate_size == cfg.moe_intermediate_size  # experts stay whole
    assert local.num_attention_heads == cfg.num_attention_heads // 2


def test_generate_with_experts_placed_gives_one_ranks_text():
    """`flashlane generate -tp 2 --expert-parallel` on the embedded model, drafts on,
    seeded: rank 1 replays each round with its half of the experts; one rank's text."""
    two = generate("--tensor-parallel-size", "2", "--expert-parallel", *SEEDED)
    params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=7)
    assert (two["text"], two["token_ids"]) == one_rank(params)
