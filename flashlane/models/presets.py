"""Named model configs (config.json dicts), kept in this one file.

`flashnext-48l` has Flash Next's real text dimensions. The shorter presets keep every per-layer
dimension and cut the depth (12 layers = 3 blocks of three GDN layers and one sparse-attention
layer) and the PLE n-gram table, so that size-faithful random checkpoints fit one GPU and
benchmarks need no download.

The siblings: `qwen3-next-48l` is Qwen3-Next-80B-A3B's published config
(tests/data/README.md says where each value comes from); `qwen3.5-moe-40l` and `qwen3.5-32l`
are the configs transformers 5.17 ships as its Qwen3.5 defaults (its docstrings: "Qwen3.5-35B-
A3B style" and "Qwen3.5-9B style"), with Qwen's 1e7 RoPE base and a 262k window. Their
`-12l` and `-4l` presets cut the depth the same way (3 GDN layers to one attention layer).
"""

from __future__ import annotations

import json
from pathlib import Path

ROPE = {
    "rope_type": "default",
    "rope_theta": 10_000_000.0,
    "partial_rotary_factor": 0.25,
    "mrope_section": [11, 11, 10],
    "mrope_interleaved": True,
}

FLASH_NEXT = dict(
    model_type="qwen4_exp_text",
    vocab_size=248_320,
    hidden_size=2560,
    num_hidden_layers=48,
    num_attention_heads=24,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=16,
    linear_num_value_heads=48,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    num_experts=512,
    num_experts_per_tok=10,
    moe_intermediate_size=640,
    shared_expert_intermediate_size=640,
    norm_topk_prob=True,
    hc_count=4,
    hc_lowrank=320,
    ple_layer_ids=[2],
    ple_embed_dim=2560,
    ple_conv_kernel_size=4,
    ngram_size=3,
    heads_per_ngram=8,
    ngram_vocab_size_base=20_000_000,
    make_ngram_vocab_size_divisible_by=128,
    split_ngram_parts=128,
    indexer_n_heads=4,
    indexer_kv_heads=1,
    indexer_head_dim=128,
    indexer_budget=2048,
    indexer_compress_ratio=4,
    output_gate_type="sigmoid",
    hidden_act="silu",
    rms_norm_eps=1e-6,
    max_position_embeddings=262_144,
    tie_word_embeddings=False,
    eos_token_id=248_044,
    bos_token_id=248_044,
    full_attention_interval=4,
    mtp_num_hidden_layers=1,
    rope_parameters=ROPE,
)


def _layer_types(n: int, interval: int = 4) -> list[str]:
    return [
        "qwen_sparse_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)
    ]


def _shorter(layers: int, ngram_base: int) -> dict:
    return dict(
        FLASH_NEXT,
        num_hidden_layers=layers,
        layer_types=_layer_types(layers),
        ngram_vocab_size_base=ngram_base,
        split_ngram_parts=8,
    )


# The structure of Flash Next at toy size: CPU smoke runs of the benchmarks.
TINY = dict(
    FLASH_NEXT,
    vocab_size=512, hidden_size=64, num_hidden_layers=4, layer_types=_layer_types(4),
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, linear_num_key_heads=2,
    linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=8,
    num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    hc_lowrank=8, ple_embed_dim=64, heads_per_ngram=2, ngram_vocab_size_base=1000,
    split_ngram_parts=4, indexer_n_heads=2, indexer_head_dim=16, indexer_budget=8,
    max_position_embeddings=4096, eos_token_id=1, bos_token_id=1,
    rope_parameters=dict(ROPE, mrope_section=[2, 1, 1]),
)  # fmt: skip

QWEN3_NEXT = dict(
    model_type="qwen3_next", vocab_size=151_936, hidden_size=2048, num_hidden_layers=48,
    num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
    linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, num_experts=512, num_experts_per_tok=10, moe_intermediate_size=512,
    shared_expert_intermediate_size=512, intermediate_size=5120, norm_topk_prob=True,
    decoder_sparse_step=1, mlp_only_layers=[], hidden_act="silu", rms_norm_eps=1e-6,
    max_position_embeddings=262_144, tie_word_embeddings=False, bos_token_id=151_643,
    eos_token_id=151_645, full_attention_interval=4, mtp_num_hidden_layers=1,
    rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0,
                     "partial_rotary_factor": 0.25},
)  # fmt: skip
QWEN3_5_MOE = dict(
    QWEN3_NEXT, model_type="qwen3_5_moe_text", vocab_size=248_320, num_hidden_layers=40,
    num_experts=256, num_experts_per_tok=8, bos_token_id=248_044, eos_token_id=248_044,
    rope_parameters=dict(ROPE, mrope_section=[11, 11, 10]),
)  # fmt: skip
QWEN3_5 = dict(
    QWEN3_5_MOE, model_type="qwen3_5_text", hidden_size=4096, num_hidden_layers=32,
    num_key_value_heads=4, intermediate_size=12288,
)  # fmt: skip


def _sibling(base: dict, layers: int) -> dict:
    types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
    return dict(base, num_hidden_layers=layers, layer_types=types)


# The siblings' structure at toy size: CPU smoke runs of the benchmarks.
SIBLING_TINY = dict(
    vocab_size=512, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
    linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
    shared_expert_intermediate_size=32, intermediate_size=96, max_position_embeddings=4096,
    eos_token_id=1, bos_token_id=1,
)  # fmt: skip


PRESETS: dict[str, dict] = {
    "flashnext-tiny": TINY,
    "flashnext-48l": dict(FLASH_NEXT, layer_types=_layer_types(48)),
    "flashnext": dict(FLASH_NEXT, layer_types=_layer_types(48)),  # the full model's name
    "flashnext-12l": _shorter(12, 200_000),
    "flashnext-4l": _shorter(4, 50_000),
    "qwen3-next-tiny": _sibling(dict(QWEN3_NEXT, **SIBLING_TINY, mlp_only_layers=[1]), 4),
    "qwen3.5-moe-tiny": _sibling(
        dict(QWEN3_5_MOE, **SIBLING_TINY, rope_parameters=dict(ROPE, mrope_section=[2, 1, 1])), 4
    ),
    "qwen3.5-tiny": _sibling(
        dict(QWEN3_5, **SIBLING_TINY, rope_parameters=dict(ROPE, mrope_section=[2, 1, 1])), 4
    ),
    "qwen3-next-48l": _sibling(QWEN3_NEXT, 48),
    "qwen3-next-12l": _sibling(QWEN3_NEXT, 12),
    "qwen3-next-4l": _sibling(QWEN3_NEXT, 4),
    "qwen3.5-moe-40l": _sibling(QWEN3_5_MOE, 40),
    "qwen3.5-moe-12l": _sibling(QWEN3_5_MOE, 12),
    "qwen3.5-32l": _sibling(QWEN3_5, 32),
    "qwen3.5-12l": _sibling(QWEN3_5, 12),
}


def preset(name: str) -> dict:
    """A copy of the named config dict; ValueError lists the names."""
    if name not in PRESETS:
        raise ValueError(f"unknown model config {name!r}; known: {', '.join(sorted(PRESETS))}")
    return dict(PRESETS[name])


def config_dict(name: str) -> dict:
    """A preset's config, or a config.json's (a model's shapes, to give random weights)."""
    if name in PRESETS or not name.endswith(".json"):
        return preset(name)
    return json.loads(Path(name).read_text())
