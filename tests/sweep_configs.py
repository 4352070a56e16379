"""Seeded random small qwen4_exp configs that span the config space, for the shape sweeps.

Each config is an HF text-config dict that transformers 5.17's qwen4_exp and
`ModelConfig.from_hf` both accept; `tests.oracle.build_oracle` turns one into a randomised
checkpoint. The first config is the shape issue 26 found batched rows differing on CUDA
(hc_count 3, hidden 96, GDN value head dim 16 against key dim 32, 12 experts top 3, vocab
1000); the rest are drawn. Fields that cycle with the index (hc_count 2..6, MTP on and off)
are cycled rather than drawn, so that any 10 consecutive configs cover them.

Sizes stay tiny (hidden <= 128, 2-4 layers) so that building one takes well under a second.
Widths are multiples of 8 (hidden of 16) as in real checkpoints, since the GPU's 16-byte
alignment of bf16 rows is a property of the checkpoints served, not of this sweep; within
that, head counts, expert counts, FFN sizes and vocab sizes avoid powers of two.
"""

from __future__ import annotations

import random

from tests.oracle import ROPE, SIBLING_ROPE, TINY

# the siblings' text model_types, cycled by sibling_configs
SIBLING_TYPES = ("qwen3_next", "qwen3_5_moe_text", "qwen3_5_text")

ISSUE_26 = dict(
    TINY,
    vocab_size=1000,
    hidden_size=96,
    num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
    hc_count=3,
    hc_lowrank=6,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=16,
    num_experts=12,
    num_experts_per_tok=3,
    moe_intermediate_size=40,
    shared_expert_intermediate_size=56,
    mtp_num_hidden_layers=1,
)


def sweep_configs(num: int = 20, seed: int = 0) -> list[dict]:
    """`num` HF config dicts: the issue-26 shape first, then seeded draws (deterministic)."""
    if num < 1:
        raise ValueError(f"num must be positive, got {num}")
    rng = random.Random(seed)
    return [dict(ISSUE_26)] + [_draw(rng, i) for i in range(1, num)]


def _draw(rng: random.Random, i: int) -> dict:
    num_layers = rng.randint(2, 4)
    layer_types = _layer_types(rng, num_layers)
    linear_ids = [j + 1 for j, t in enumerate(layer_types) if t == "linear_attention"]
    # PLE on no layer, one layer or two, wherever the linear layers are
    num_ple = rng.choice([0, 1, 1, 2])
    ple_layer_ids = sorted(rng.sample(linear_ids, min(num_ple, len(linear_ids))))
    ngram_size = rng.choice([2, 3, 4])
    heads_per_ngram = rng.choice([1, 2, 3])
    num_ngram_heads = (ngram_size - 1) * heads_per_ngram
    ple_embed_dim = num_ngram_heads * rng.choice([4, 8, 12])

    num_heads, num_kv_heads = rng.choice([(3, 1), (3, 3), (5, 1), (6, 2), (6, 3), (4, 2), (7, 7)])
    head_dim = rng.choice([16, 32])
    partial = rng.choice([0.25, 0.5, 1.0])
    rotary_dim = int(head_dim * partial)
    indexer_head_dim = rng.choice([d for d in (16, 32) if d >= rotary_dim])
    compress = rng.choice([2, 3, 4, 5, 8])
    num_experts = rng.choice([3, 5, 7, 9, 11, 12, 13])
    linear_k_heads = rng.choice([1, 2, 3])
    k_dim, v_dim = rng.choice([(32, 16), (16, 32), (16, 8), (8, 16), (16, 16), (32, 32)])
    eos = rng.choice([1, 2])
    return dict(
        vocab_size=rng.choice([517, 777, 1000, 1003, 600, 901]),
        hidden_size=rng.choice([48, 64, 80, 96, 112, 128]),
        num_hidden_layers=num_layers,
        layer_types=layer_types,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        linear_num_key_heads=linear_k_heads,
        linear_num_value_heads=linear_k_heads * rng.choice([1, 2, 3]),
        linear_key_head_dim=k_dim,
        linear_value_head_dim=v_dim,
        linear_conv_kernel_dim=rng.choice([2, 3, 4]),
        num_experts=num_experts,
        num_experts_per_tok=rng.randint(1, min(4, num_experts)),
        moe_intermediate_size=rng.choice([24, 40, 48, 56, 72]),
        shared_expert_intermediate_size=rng.choice([24, 40, 56, 88]),
        norm_topk_prob=rng.random() < 0.8,
        hc_count=2 + i % 5,
        hc_lowrank=rng.choice([2, 3, 5, 8, 12]),
        ple_layer_ids=ple_layer_ids,
        ple_embed_dim=ple_embed_dim,
        ple_conv_kernel_size=rng.choice([2, 3, 4]),
        ngram_size=ngram_size,
        heads_per_ngram=heads_per_ngram,
        ngram_vocab_size_base=rng.choice([300, 1000, 1700]),
        make_ngram_vocab_size_divisible_by=rng.choice([64, 128]),
        split_ngram_parts=rng.choice([1, 2, 4]),
        seed=rng.randint(0, 9999),
        indexer_n_heads=rng.choice([1, 2, 3, 5]),
        indexer_kv_heads=1,
        indexer_head_dim=indexer_head_dim,
        indexer_budget=compress * rng.randint(1, 4),
        indexer_compress_ratio=compress,
        output_gate_type=rng.choice(["sigmoid", "silu"]),
        hidden_act="silu",
        max_position_embeddings=512,
        tie_word_embeddings=rng.random() < 0.2,
        eos_token_id=eos,
        bos_token_id=eos,
        rope_parameters=dict(
            ROPE,
            rope_theta=rng.choice([1e4, 1e6, 1e7]),
            partial_rotary_factor=partial,
            mrope_section=[rotary_dim // 2 - 2, 1, 1],
        ),
        mtp_num_hidden_layers=i % 2,
    )


def _layer_types(rng: random.Random, num_layers: int) -> list[str]:
    """At least one GDN layer and one sparse-attention layer, in any order."""
    while True:
        types = [
            rng.choice(["linear_attention", "full_attention", "qwen_sparse_attention"])
            for _ in range(num_layers)
        ]
        if "linear_attention" in types and len(set(types) - {"linear_attention"}) > 0:
            return types


def sibling_configs(num: int = 6, seed: int = 1) -> list[dict]:
    """`num` seeded random small configs of the siblings (issue 33: Qwen3-Next, Qwen3.5-MoE,
    Qwen3.5 dense, cycled), HF config dicts their transformers classes and
    `ModelConfig.from_hf` accept: head and KV head counts, head and GDN dims, the rotated
    fraction and mRoPE sections, conv taps, experts, dense layers, tied embeddings and MTP
    on and off drawn or cycled as in sweep_configs."""
    if num < 1:
        raise ValueError(f"num must be positive, got {num}")
    rng = random.Random(seed)
    return [_draw_sibling(rng, i, SIBLING_TYPES[i % len(SIBLING_TYPES)]) for i in range(num)]


def _draw_sibling(rng: random.Random, i: int, model_type: str) -> dict:
    num_layers = rng.randint(2, 5)
    while True:  # at least one GDN layer and one attention layer, in any order
        types = [rng.choice(["linear_attention", "full_attention"]) for _ in range(num_layers)]
        if len(set(types)) == 2:
            break
    num_heads, num_kv_heads = rng.choice([(4, 2), (3, 1), (6, 3), (5, 5), (4, 1), (6, 2)])
    head_dim = rng.choice([16, 32])
    partial = rng.choice([0.25, 0.5, 1.0])
    half = int(head_dim * partial) // 2  # rotated pairs: the mRoPE sections' sum
    linear_k_heads = rng.choice([1, 2, 3])
    k_dim, v_dim = rng.choice([(32, 16), (16, 32), (16, 16), (8, 16), (32, 32)])
    eos = rng.choice([1, 2])
    spec = dict(
        model_type=model_type,
        vocab_size=rng.choice([512, 517, 777, 1000, 901]),
        hidden_size=rng.choice([48, 64, 80, 96, 112]),
        num_hidden_layers=num_layers,
        layer_types=types,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        linear_num_key_heads=linear_k_heads,
        linear_num_value_heads=linear_k_heads * rng.choice([1, 2, 3]),
        linear_key_head_dim=k_dim,
        linear_value_head_dim=v_dim,
        linear_conv_kernel_dim=rng.choice([2, 3, 4]),
        intermediate_size=rng.choice([40, 72, 96, 120]),
        hidden_act="silu",
        max_position_embeddings=512,
        tie_word_embeddings=rng.random() < 0.3,
        eos_token_id=eos,
        bos_token_id=eos,
        mtp_num_hidden_layers=(i // len(SIBLING_TYPES)) % 2 ^ 1,
    )
    rope = dict(SIBLING_ROPE, rope_theta=rng.choice([1e4, 1e6, 1e7]), partial_rotary_factor=partial)
    if model_type != "qwen3_next":  # Qwen3.5: the text config's mRoPE sections
        third = half // 3
        rope.update(mrope_section=[half - 2 * third, third, third], mrope_interleaved=True)
    spec["rope_parameters"] = rope
    if model_type != "qwen3_5_text":  # the MoE families
        num_experts = rng.choice([3, 5, 6, 7, 9])
        spec.update(
            num_experts=num_experts,
            num_experts_per_tok=rng.randint(1, min(4, num_experts)),
            moe_intermediate_size=rng.choice([24, 32, 40, 56]),
            shared_expert_intermediate_size=rng.choice([24, 32, 48, 72]),
            norm_topk_prob=rng.random() < 0.8,
            decoder_sparse_step=1,
        )
        if model_type == "qwen3_next" and rng.random() < 0.5:  # a dense layer among them
            spec["mlp_only_layers"] = [rng.randrange(num_layers)]
    return spec
