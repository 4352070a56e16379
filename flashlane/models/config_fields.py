"""config.json's fields, read and checked for ModelConfig.from_hf: ConfigError, the int reader,
the layer-type spellings, the siblings' own fields and the checks across fields."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from flashlane.models.config import ModelConfig

SPARSE_SPELLINGS = frozenset(
    {"full_attention", "qwen_sparse_attention", "deepseek_sparse_attention", "hybrid_indexed"}
)
LINEAR_SPELLINGS = frozenset({"linear_attention"})


class ConfigError(ValueError):
    """A config.json that flashlane cannot serve; the message names the field and the file."""


def read_layer_types(
    raw: dict[str, Any], num_layers: int, where: str, family: str = "flashnext"
) -> tuple[str, ...]:
    """The layer kinds; a sibling's attention layers (spelled `full_attention`) are "full"."""
    attention = "sparse" if family == "flashnext" else "full"
    types = raw.get("layer_types")
    if types is None:
        interval = raw.get("full_attention_interval", 4)
        return tuple(attention if (i + 1) % interval == 0 else "linear" for i in range(num_layers))
    if not isinstance(types, list) or len(types) != num_layers:
        raise ConfigError(f"{where}: field 'layer_types' must list {num_layers} layer types")
    out = []
    for i, t in enumerate(types):
        if family != "flashnext" and t == "full_attention":
            out.append("full")
        elif family == "flashnext" and t in SPARSE_SPELLINGS:
            out.append("sparse")
        elif t in LINEAR_SPELLINGS:
            out.append("linear")
        else:
            raise ConfigError(f"{where}: field 'layer_types[{i}]' is {t!r}, an unknown layer type")
    return tuple(out)


def flashnext_fields(
    raw: dict[str, Any], r: FieldReader, hidden: int, ple_one: list[int]
) -> dict[str, Any]:
    """Flash Next's own fields: its MoE, hyper-connections, PLE (ple_one: config.json's
    one-indexed PLE layers, checked by the caller) and the QSA indexer."""
    return dict(
        num_experts=r.int("num_experts"),
        num_experts_per_tok=r.int("num_experts_per_tok"),
        moe_intermediate_size=r.int("moe_intermediate_size"),
        shared_expert_intermediate_size=r.int("shared_expert_intermediate_size"),
        norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
        hc_count=r.int("hc_count", 4),
        hc_lowrank=r.int("hc_lowrank", 320),
        ple_layer_ids=tuple(sorted({i - 1 for i in ple_one})),
        ple_embed_dim=r.int("ple_embed_dim", hidden) if raw.get("ple_embed_dim") else hidden,
        ple_conv_kernel=r.int("ple_conv_kernel_size", 4),
        ngram_size=r.int("ngram_size", 3),
        heads_per_ngram=r.int("heads_per_ngram", 8),
        ngram_vocab_size_base=r.int("ngram_vocab_size_base", 20_000_000),
        ngram_vocab_divisor=r.int("make_ngram_vocab_size_divisible_by", 128),
        ngram_seed=r.int("seed", 1234, allow_zero=True),
        split_ngram_parts=r.int("split_ngram_parts", 512),
        indexer_n_heads=r.int("indexer_n_heads"),
        indexer_head_dim=r.int("indexer_head_dim"),
        indexer_budget=r.int("indexer_budget"),
        indexer_block=r.int("indexer_compress_ratio"),
    )


def sibling_fields(
    raw: dict[str, Any], r: FieldReader, family: str, num_layers: int, where: str
) -> dict[str, Any]:
    """A sibling's MLP fields (qwen3_5: dense everywhere; qwen3_next: MoE except
    mlp_only_layers and off the decoder_sparse_step; qwen3_5_moe: MoE everywhere, top-k
    always renormalised), and Flash Next's own parts switched off: one residual stream, no
    PLE, no indexer."""
    for name in ("attention_bias", "mtp_use_dedicated_embeddings"):
        if raw.get(name):
            raise ConfigError(f"{where}: field '{name}' is set; flashlane does not serve it")
    none = dict(
        hc_count=1, hc_lowrank=0, ple_layer_ids=(), ple_embed_dim=r.int("hidden_size"),
        ple_conv_kernel=4, ngram_size=3, heads_per_ngram=1, ngram_vocab_size_base=1,
        ngram_vocab_divisor=1, ngram_seed=0, split_ngram_parts=1, indexer_n_heads=0,
        indexer_head_dim=0, indexer_budget=0, indexer_block=1,
    )  # fmt: skip
    if family == "qwen3_5":
        return dict(
            none, num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0,
            shared_expert_intermediate_size=0, norm_topk_prob=True,
            intermediate_size=r.int("intermediate_size"),
            dense_mlp_layers=tuple(range(num_layers)),
        )  # fmt: skip
    dense: tuple[int, ...] = ()
    if family == "qwen3_next":
        only = raw.get("mlp_only_layers") or []
        if not isinstance(only, list) or not all(isinstance(i, int) for i in only):
            raise ConfigError(f"{where}: field 'mlp_only_layers' must be a list of ints")
        step = r.int("decoder_sparse_step", 1)
        dense = tuple(i for i in range(num_layers) if i in only or (i + 1) % step)
    return dict(
        none,
        num_experts=r.int("num_experts"),
        num_experts_per_tok=r.int("num_experts_per_tok"),
        moe_intermediate_size=r.int("moe_intermediate_size"),
        shared_expert_intermediate_size=r.int("shared_expert_intermediate_size"),
        norm_topk_prob=family == "qwen3_5_moe" or bool(raw.get("norm_topk_prob", True)),
        intermediate_size=r.int("intermediate_size") if dense else 0,
        dense_mlp_layers=dense,
    )


def check_fields(cfg: ModelConfig, raw: dict[str, Any], where: str) -> None:
    def need(ok: bool, name: str, why: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: field '{name}' {why}")

    need(
        cfg.rotary_dim <= cfg.head_dim and cfg.rotary_dim % 2 == 0,
        "rope_parameters.partial_rotary_factor",
        "must give an even rotary width that fits the attention head",
    )

    need(
        cfg.num_attention_heads % cfg.num_kv_heads == 0,
        "num_key_value_heads",
        "must divide num_attention_heads",
    )
    need(
        cfg.linear_num_v_heads % cfg.linear_num_k_heads == 0,
        "linear_num_value_heads",
        "must be a multiple of linear_num_key_heads",
    )
    need(
        cfg.num_experts_per_tok <= cfg.num_experts,
        "num_experts_per_tok",
        "must not exceed num_experts",
    )
    if cfg.family != "flashnext":
        return
    need(cfg.hc_count > 1, "hc_count", "must be greater than 1")
    need(raw.get("indexer_kv_heads", 1) == 1, "indexer_kv_heads", "must be 1")
    need(
        cfg.indexer_budget % cfg.indexer_block == 0,
        "indexer_budget",
        "must be a multiple of indexer_compress_ratio",
    )
    need(
        cfg.rotary_dim <= cfg.indexer_head_dim and cfg.rotary_dim % 2 == 0,
        "rope_parameters.partial_rotary_factor",
        "must give an even rotary width that fits the indexer head",
    )
    if cfg.ple_layer_ids:
        need(
            cfg.ple_embed_dim % cfg.num_ngram_heads == 0,
            "ple_embed_dim",
            f"must be divisible by the {cfg.num_ngram_heads} n-gram heads",
        )


class FieldReader:
    def __init__(self, raw: dict[str, Any], where: str):
        self.raw, self.where = raw, where

    def int(self, name: str, default: int | None = None, allow_zero: bool = False) -> int:
        value = self.raw.get(name, default)
        if value is None:
            raise ConfigError(f"{self.where}: field '{name}' is missing")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{self.where}: field '{name}' must be an int, got {value!r}")
        if value < 0 or (value == 0 and not allow_zero):
            raise ConfigError(f"{self.where}: field '{name}' must be positive, got {value}")
        return value
