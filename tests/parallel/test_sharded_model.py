"""Two ranks on gloo (processes on 127.0.0.1) against one: the eager reference path of the
tiny oracle checkpoint, sharded by parallel/plan.py.

Tolerance: logits within 1e-6 of the largest |logit| of TP=1 (the CPU computes in fp64 and
rounds logits to fp32, so a different summation order of the row-parallel parts almost never
shows; bf16 on GPUs is not measured here: no multi-GPU machine was lent). Tokens, greedy and
seeded, equal TP=1's exactly; at TP=2 a prompt's logits are the same bits alone and batched,
and a drafted window's the same bits as its rows fed one at a time."""

from __future__ import annotations

import pytest
import torch

from flashlane.models.config import ModelConfig
from flashlane.parallel.plan import ShardingError, shard_config
from tests.parallel.ranks import replies, run_rank, spawn_ranks

TOLERANCE = 1e-6


# (checkpoint, ranks): Flash Next's tiny one on 2; Qwen3-Next's covers gated full attention,
# a dense MLP layer and a shared expert wider than the routed ones (run beside them, not
# stacked); on 4 ranks the tiny one has fewer KV and GDN key heads than ranks (replicated)
@pytest.fixture(
    scope="module",
    params=[
        ("tiny", 2),
        pytest.param(("qwen3_next", 2), marks=pytest.mark.slow),
        pytest.param(("tiny", 4), marks=pytest.mark.slow),
    ],
    ids=lambda p: f"{p[0]}-tp{p[1]}",
)
def both(request, oracle_by_name, tmp_path_factory):
    name, size = request.param
    ckpt = str(oracle_by_name(name))
    out = tmp_path_factory.mktemp("tp") / "rank0.pt"
    spawn_ranks(run_rank, size, ckpt, str(out))
    return replies(ckpt, None), torch.load(out)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_logits_within_tolerance_of_one_rank(both):
    one, two = both
    for key in ("logits", "greedy_logits", "seeded_logits"):
        assert two[key].shape == one[key].shape
        assert _rel(two[key], one[key]) <= TOLERANCE, key


def test_replies_equal_one_rank_greedy_and_seeded(both):
    one, two = both
    assert two["greedy"] == one["greedy"]
    assert two["seeded"] == one["seeded"]
    assert one["greedy"] != one["seeded"]  # the seeded draws are not the greedy ones


def test_two_ranks_alone_batched_and_drafted_are_the_same_bits(both):
    _, two = both
    assert torch.equal(two["batched"], two["logits"])
    assert torch.equal(two["other_batched"], two["other_alone"])
    # the greedy reply fed back as one window: each row's logits are its one-row step's
    assert torch.equal(two["drafted"], two["greedy_logits"])


def test_a_size_that_does_not_divide_names_the_numbers(tiny_ckpt):
    cfg = ModelConfig.from_hf(tiny_ckpt / "config.json")
    with pytest.raises(ShardingError, match=r"size 3 .*attention heads .*4.*KV heads .*2"):
        shard_config(cfg, 3)
    with pytest.raises(ShardingError, match=r"size 8 .*attention heads .*4"):
        shard_config(cfg, 8)
    four = shard_config(cfg, 4)  # one KV head and one GDN key head a rank, replicated
    assert (four.num_kv_heads, four.linear_num_k_heads, four.linear_num_v_heads) == (1, 1, 1)
    local = shard_config(cfg, 2)
    assert (local.num_attention_heads, local.num_kv_heads) == (2, 1)
    assert (local.linear_num_k_heads, local.linear_num_v_heads) == (1, 2)
    assert local.moe_intermediate_size == cfg.moe_intermediate_size // 2
