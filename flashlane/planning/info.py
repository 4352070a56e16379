"""describe: the text of `flashlane info MODEL` (config, parameters by part, cache and state
sizes, and the memory plan when one is given), from the figures in `models/census.py`.
No torch."""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from flashlane.models.census import (
    count_params,
    indexer_bytes_per_block,
    kv_bytes_per_token,
    state_bytes_per_stream,
)
from flashlane.models.config import ModelConfig
from flashlane.models.weight_bytes import Fp8Bytes, fp8_bytes
from flashlane.planning.shorter import shorter_contexts
from flashlane.sessions.slots import format_slot_contexts

if TYPE_CHECKING:
    from flashlane.models.fp8 import QuantSpec
    from flashlane.planning.memory import MemoryPlan

GIB = 2**30


def describe(
    cfg: ModelConfig, plan: MemoryPlan | None = None, quant: QuantSpec | None = None
) -> str:
    """The text of `flashlane info MODEL`: config, parameters by part, cache and state sizes,
    the block-FP8 weight bytes when config.json has a quantization_config, and the memory plan
    when one is given."""
    counts = count_params(cfg)
    lines = [*_config_lines(cfg), "", "parameters:"]
    # a sibling's "hyper-connections" are its pre-norms, its "mixer" the final norm
    names = (
        {}
        if cfg.has_hyper_connections
        else {"hyper_connections": "norms", "final_mixer": "final_norm"}
    )
    for f in fields(counts):
        if not f.name.startswith("active"):
            lines.append(_param_line(names.get(f.name, f.name), getattr(counts, f.name)))
    lines += [
        _param_line("text", counts.text),
        _param_line("total", counts.total) + "  (as transformers counts: text + table + vision)",
        _param_line("loaded", counts.loaded) + "  (text + table + MTP)",
        _param_line("active/token", counts.active),
        _param_line("active+table", counts.active_with_table)
        + "  (the whole embedding table counted, as model cards count)",
        "",
        *_cache_lines(cfg),
    ]
    if quant is not None:
        lines += ["", *_fp8_lines(fp8_bytes(cfg, quant), quant)]
    if plan is not None:
        lines += ["", *_plan_lines(plan)]
    return "\n".join(lines)


def _config_lines(cfg: ModelConfig) -> list[str]:
    if not cfg.has_hyper_connections:
        return _sibling_lines(cfg)
    num_sparse = cfg.layer_types.count("sparse")
    ple = ", ".join(str(i + 1) for i in cfg.ple_layer_ids) or "none"
    return [
        f"model_type: {cfg.model_type}",
        f"layers: {cfg.num_layers} ({cfg.num_layers - num_sparse} Gated DeltaNet, {num_sparse} "
        f"sparse attention) + {cfg.num_mtp_layers} MTP",
        f"hidden: {cfg.hidden_size} x {cfg.hc_count} hyper-connection streams; "
        f"vocab: {cfg.vocab_size:,}; window: {cfg.max_position_embeddings:,} tokens",
        f"attention: {cfg.num_attention_heads} q / {cfg.num_kv_heads} kv heads x {cfg.head_dim}; "
        f"indexer {cfg.indexer_n_heads} x {cfg.indexer_head_dim}, "
        f"top {cfg.indexer_top_blocks} blocks of {cfg.indexer_block}",
        f"GDN: {cfg.linear_num_k_heads} k / {cfg.linear_num_v_heads} v heads x "
        f"{cfg.linear_k_head_dim}/{cfg.linear_v_head_dim}, conv {cfg.linear_conv_kernel}",
        f"MoE: {cfg.num_experts} experts, top {cfg.num_experts_per_tok}, width "
        f"{cfg.moe_intermediate_size}; shared expert {cfg.shared_expert_intermediate_size}",
        f"PLE layers (one-indexed): {ple}; {cfg.num_ngram_heads} n-gram heads",
    ]


def _sibling_lines(cfg: ModelConfig) -> list[str]:
    """A sibling's config: gated full attention, no hyper-connections, PLE or indexer."""
    num_full = cfg.num_attention_layers
    dense = len(cfg.dense_mlp_layers)
    mlp = (
        f"MoE: {cfg.num_experts} experts, top {cfg.num_experts_per_tok}, width "
        f"{cfg.moe_intermediate_size}; shared expert {cfg.shared_expert_intermediate_size}"
        if cfg.num_experts
        else "MoE: none"
    )
    return [
        f"model_type: {cfg.model_type} ({cfg.family})",
        f"layers: {cfg.num_layers} ({cfg.num_layers - num_full} Gated DeltaNet, {num_full} "
        f"gated full attention) + {cfg.num_mtp_layers} MTP",
        f"hidden: {cfg.hidden_size} (plain pre-norm residual); vocab: {cfg.vocab_size:,}; "
        f"window: {cfg.max_position_embeddings:,} tokens",
        f"attention: {cfg.num_attention_heads} q / {cfg.num_kv_heads} kv heads x {cfg.head_dim}, "
        f"rotary {cfg.rotary_dim} dims (theta {cfg.rope_theta:g})",
        f"GDN: {cfg.linear_num_k_heads} k / {cfg.linear_num_v_heads} v heads x "
        f"{cfg.linear_k_head_dim}/{cfg.linear_v_head_dim}, conv {cfg.linear_conv_kernel}",
        mlp + (f"; {dense} dense MLP layers of width {cfg.intermediate_size}" if dense else ""),
    ]


def _cache_lines(cfg: ModelConfig) -> list[str]:
    kv = kv_bytes_per_token(cfg)
    kv_mtp = kv_bytes_per_token(cfg, with_mtp=True)
    layers = cfg.num_attention_layers + cfg.num_mtp_layers
    kv8 = layers * 2 * cfg.num_kv_heads * (cfg.head_dim + 4)
    block = indexer_bytes_per_block(cfg, with_mtp=True)
    state = state_bytes_per_stream(cfg)
    indexer = (
        [
            f"indexer keys (raw + pooled, bf16, with MTP): {block:,} bytes per block of "
            f"{cfg.indexer_block} tokens"
        ]
        if cfg.indexer_head_dim
        else []
    )
    return [
        f"KV bytes per token (bf16): {kv:,} ({kv / 1024:g} KiB); with the MTP layer {kv_mtp:,}",
        f"  with --kv-cache-dtype fp8 (e4m3 + an fp32 scale a head), with the MTP layer: {kv8:,}",
        *indexer,
        f"state bytes per stream (fp32 GDN states, bf16 conv and PLE tail): {state:,} "
        f"({state / 2**20:.1f} MiB)",
    ]


def _plan_lines(p: MemoryPlan) -> list[str]:
    def gib(n: int) -> str:
        return f"{n / GIB:9.2f} GiB ({n:,} bytes)"

    lines = [
        f"memory plan ({p.device}, {p.cache_bytes}-byte cache, {p.state_bytes}-byte states"
        f"{_kv_note(p)}):",
        f"  limit              {gib(p.limit_bytes)}",
        f"  weights            {gib(p.weight_bytes)}",
        f"  verify scratch     {gib(p.scratch_bytes)}  ({p.max_rows} rows)",
        f"  activations        {gib(p.activation_bytes)}  (logits + fixed allowance"
        f" + prompt pieces of {p.prompt_rows} rows)",
        f"  prompt cache       {gib(p.prompt_cache_bytes)}",
        f"  session budget     {gib(p.budget_bytes)}",
        f"  sessions           {p.num_sessions} ({'auto' if p.auto else 'given'}): "
        f"{format_slot_contexts(p.capacities)} tokens",
        f"  sessions take      {gib(p.sessions_bytes)}{_draw_note(p)}",
        f"  left               {gib(p.free_bytes)}",
    ]
    if p.serial:
        lines.append("  fewer than two sessions fit: one reply at a time")
        if p.shorter:
            lines.append(f"  shorter sessions   {shorter_contexts(p)}")
    if p.host_limit_bytes is not None:
        lines.append(f"  host (n-gram table) {gib(p.host_bytes)} of {gib(p.host_limit_bytes)}")
        eight = ", int8 with a per-row scale" if p.host_dtype == "int8" else ", bf16"
        lines.append(
            f"  where              weights on {p.device}; n-gram tables in host memory{eight}"
        )
    else:
        lines.append(f"  where              weights and n-gram tables on {p.device}")
    return lines


def _draw_note(p: MemoryPlan) -> str:
    if not p.draw_row_bytes:
        return ""
    return f"  (each {p.draw_row_bytes / 2**20:.2f} MiB of sampled steps' buffers)"


def _kv_note(p: MemoryPlan) -> str:
    if not p.kv_fp8:
        return ""
    return "; KV and indexer keys 1-byte e4m3 + an fp32 scale a row and head, block keys not"


def _fp8_lines(b: Fp8Bytes, quant: QuantSpec) -> list[str]:
    return [
        f"block FP8 weights (quantization_config, {quant.block[0]}x{quant.block[1]} blocks): "
        f"{b.total_bytes / GIB:.2f} GiB ({b.total_bytes:,} bytes)",
        f"  e4m3 values       {b.quantized / 1e9:>9.3f}B  x 1 byte",
        f"  fp32 scales       {b.scales / 1e6:>9.3f}M  x 4 bytes",
        f"  unquantized       {b.other / 1e9:>9.3f}B  x 2 bytes (bf16)",
        "  (kept FP8 on cuda, for the FP8 GEMMs; dequantized to the compute dtype on the CPU)",
    ]


def _param_line(name: str, value: int) -> str:
    return f"  {name.replace('_', ' '):<18}{value / 1e9:>9.3f}B  {value:>17,}"
