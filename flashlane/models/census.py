"""Parameter counts by part, cache bytes per token and state bytes per stream, from a ModelConfig.

Nothing is allocated: every figure is arithmetic over the config, counted as transformers 5.17
builds the modules (`Qwen4ExpForConditionalGeneration`, and the siblings' causal LMs, on the
meta device give the same totals, which tests check). The MTP head, which transformers drops,
is counted apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from flashlane.models.config import ModelConfig

# Qwen4ExpVisionConfig's defaults, for keys a vision_config leaves out.
VISION_DEFAULTS: dict[str, Any] = {
    "depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
    "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
    "out_hidden_size": 3584, "num_position_embeddings": 2304,
}  # fmt: skip


TEXT_PARTS = (
    "embeddings", "lm_head", "gdn", "attention", "experts", "shared_expert", "router", "mlp",
    "hyper_connections", "ple", "final_mixer",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ParamCounts:
    """Parameters by part; the text parts sum over every decoder layer."""

    embeddings: int
    lm_head: int  # 0 when tied to the embeddings
    gdn: int  # Gated DeltaNet mixers of the linear layers
    attention: int  # sparse attention mixers, indexer included
    experts: int  # routed experts
    shared_expert: int  # shared expert MLP and its sigmoid gate
    router: int
    mlp: int  # dense MLPs (a sibling's dense layers)
    # the attention and MLP hyper-connections of every layer (a sibling: its two pre-norms)
    hyper_connections: int
    ple: int  # PLE projections, norms and dilated convs (the n-gram table apart)
    final_mixer: int  # the model's hyper_connection_mixer (a sibling: its final norm)
    ngram_table: int  # ple_embedding.ngram_embedding of every PLE layer
    vision: int  # the vision tower, which flashlane does not load
    mtp: int  # the MTP head (all cfg.num_mtp_layers layers), which transformers drops
    active: int  # parameters one token reads (top-k experts, one embedding row, table rows)
    # `active` with the whole embedding table, as model cards count it (Qwen3-Next-80B-A3B's
    # published "3.87B active" is this figure)
    active_with_table: int

    @property
    def text(self) -> int:
        return sum(getattr(self, name) for name in TEXT_PARTS)

    @property
    def total(self) -> int:
        """What transformers counts: text, n-gram table and vision tower, MTP not included."""
        return self.text + self.ngram_table + self.vision

    @property
    def loaded(self) -> int:
        """What flashlane loads: text, n-gram table and MTP head (no vision tower)."""
        return self.text + self.ngram_table + self.mtp


def gdn_layer_params(cfg: ModelConfig) -> int:
    h, hv, conv, value = (
        cfg.hidden_size,
        cfg.linear_num_v_heads,
        cfg.linear_conv_dim,
        cfg.linear_value_dim,
    )
    # in_proj_qkv, in_proj_z, in_proj_b and in_proj_a, out_proj
    projections = h * conv + h * value + 2 * h * hv + value * h
    # the depthwise conv, dt_bias and A_log, the gated norm
    return projections + conv * cfg.linear_conv_kernel + 2 * hv + cfg.linear_v_head_dim


def attention_layer_params(cfg: ModelConfig) -> int:
    h, d = cfg.hidden_size, cfg.head_dim
    q = cfg.num_attention_heads * d
    # q_proj emits q and the per-head output gate, hence 2 * q
    mixer = h * 2 * q + 2 * h * cfg.num_kv_heads * d + q * h + 2 * d
    indexer = h * (cfg.indexer_n_heads + 1) * cfg.indexer_head_dim + 2 * cfg.indexer_head_dim
    return mixer + indexer


def expert_params(cfg: ModelConfig) -> int:
    """One routed expert: gate, up and down projections."""
    return 3 * cfg.hidden_size * cfg.moe_intermediate_size


def shared_expert_params(cfg: ModelConfig) -> int:
    return 3 * cfg.hidden_size * cfg.shared_expert_intermediate_size + cfg.hidden_size


def hyper_connection_params(cfg: ModelConfig, inject: bool = True) -> int:
    """One hyper-connection (a sibling: the plain norm in its place)."""
    if not cfg.has_hyper_connections:
        return cfg.hidden_size
    wide = cfg.hc_count * cfg.hidden_size
    # grouped norm, low-rank down and up, and the per-stream write weights
    return wide + 2 * wide * cfg.hc_lowrank + (wide * cfg.hc_count if inject else 0)


def ple_layer_params(cfg: ModelConfig) -> int:
    """One PLE layer without its n-gram table: key/value projections, three norms, the conv."""
    wide = cfg.hc_count * cfg.hidden_size
    e = cfg.ple_embed_dim
    return e * wide + e * cfg.hidden_size + 3 * wide + wide * cfg.ple_conv_kernel


def ngram_head_sizes(cfg: ModelConfig, ple_index: int) -> tuple[int, ...]:
    """Vocab size of each hash head of the `ple_index`-th PLE layer: consecutive primes.

    Global head g = ple_index * num_ngram_heads + head takes the (g + 1)-th prime at or after
    ngram_vocab_size_base.
    """
    first = ple_index * cfg.num_ngram_heads
    primes: list[int] = []
    candidate = cfg.ngram_vocab_size_base - 1
    while len(primes) < first + cfg.num_ngram_heads:
        candidate += 1
        if _is_prime(candidate):
            primes.append(candidate)
    return tuple(primes[first:])


def ngram_table_rows(cfg: ModelConfig, ple_index: int) -> int:
    """Rows of one PLE layer's table: the heads' vocab sizes, padded to the divisor."""
    total = sum(ngram_head_sizes(cfg, ple_index))
    return -(-total // cfg.ngram_vocab_divisor) * cfg.ngram_vocab_divisor


def vision_params(vision: dict[str, Any] | None) -> int:
    """Qwen4ExpVisionModel's parameters: patch conv, position table, blocks, patch merger."""
    if vision is None:
        return 0
    v = {**VISION_DEFAULTS, **vision}
    h, inner = v["hidden_size"], v["intermediate_size"]
    for key in ("patch_size", "temporal_patch_size"):
        if not isinstance(v[key], int):
            raise ValueError(f"vision_config.{key} must be an int to count it, got {v[key]!r}")
    patch = v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2 * h + h
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * inner + inner) + (inner * h + h)
    merged = h * v["spatial_merge_size"] ** 2
    merger = 2 * h + merged * merged + merged + merged * v["out_hidden_size"] + v["out_hidden_size"]
    return patch + v["num_position_embeddings"] * h + v["depth"] * block + merger


def mtp_params(cfg: ModelConfig) -> int:
    """The MTP head: two pre-fc norms, fc_embedding and fc_hidden (a sibling: one fc over
    both), its decoder layers (attention + the MLP, two hyper-connections or norms each) and
    its own mixer (a sibling: its norm); it shares the lm_head."""
    if cfg.num_mtp_layers == 0:
        return 0
    h = cfg.hidden_size
    head = h + cfg.hc_count * h + 2 * h * h + hyper_connection_params(cfg, inject=False)
    return head + cfg.num_mtp_layers * _attention_decoder_params(cfg)


def mlp_params(cfg: ModelConfig, layer_idx: int) -> int:
    """One layer's MLP: routed experts, router and shared expert, or the dense MLP."""
    if cfg.is_moe_layer(layer_idx):
        routed = cfg.num_experts * (expert_params(cfg) + cfg.hidden_size)
        return routed + shared_expert_params(cfg)
    return 3 * cfg.hidden_size * cfg.intermediate_size


def count_params(cfg: ModelConfig) -> ParamCounts:
    num_linear = cfg.layer_types.count("linear")
    num_moe = sum(map(cfg.is_moe_layer, range(cfg.num_layers)))
    num_ple = len(cfg.ple_layer_ids)
    table_width = cfg.ple_embed_dim // cfg.num_ngram_heads if num_ple else 0
    table_rows = sum(ngram_table_rows(cfg, i) for i in range(num_ple))
    counts = ParamCounts(
        embeddings=cfg.vocab_size * cfg.hidden_size,
        lm_head=0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size,
        gdn=num_linear * gdn_layer_params(cfg),
        attention=cfg.num_attention_layers * attention_layer_params(cfg),
        experts=num_moe * cfg.num_experts * expert_params(cfg),
        shared_expert=num_moe * shared_expert_params(cfg),
        router=num_moe * cfg.num_experts * cfg.hidden_size,
        mlp=(cfg.num_layers - num_moe) * 3 * cfg.hidden_size * cfg.intermediate_size,
        hyper_connections=cfg.num_layers * 2 * hyper_connection_params(cfg),
        ple=num_ple * ple_layer_params(cfg),
        final_mixer=hyper_connection_params(cfg, inject=False),
        ngram_table=table_rows * table_width,
        vision=vision_params(cfg.vision),
        mtp=mtp_params(cfg),
        active=0,
        active_with_table=0,
    )
    unread = num_moe * (cfg.num_experts - cfg.num_experts_per_tok) * expert_params(cfg)
    table_read = num_ple * cfg.num_ngram_heads * table_width
    active = counts.text - counts.embeddings + cfg.hidden_size - unread + table_read
    return replace(
        counts, active=active, active_with_table=active - cfg.hidden_size + counts.embeddings
    )


def kv_bytes_per_token(cfg: ModelConfig, cache_bytes: int = 2, with_mtp: bool = False) -> int:
    """K and V of every attention layer (and the MTP layers), per token of context."""
    layers = cfg.num_attention_layers + (cfg.num_mtp_layers if with_mtp else 0)
    return layers * 2 * cfg.num_kv_heads * cfg.head_dim * cache_bytes


def indexer_bytes_per_block(cfg: ModelConfig, cache_bytes: int = 2, with_mtp: bool = False) -> int:
    """Indexer raw keys of one block of tokens plus its pooled key, over the sparse layers
    (a sibling has no indexer: 0)."""
    layers = cfg.num_attention_layers + (cfg.num_mtp_layers if with_mtp else 0)
    return layers * (cfg.indexer_block + 1) * cfg.indexer_head_dim * cache_bytes


def state_bytes_per_stream(cfg: ModelConfig, cache_bytes: int = 2, state_bytes: int = 4) -> int:
    """The context-independent state of one stream: GDN conv windows and recurrent states,
    the PLE conv tail and n-gram ids."""
    num_linear = cfg.layer_types.count("linear")
    recurrent = cfg.linear_num_v_heads * cfg.linear_k_head_dim * cfg.linear_v_head_dim
    gdn = num_linear * (
        cfg.linear_conv_dim * (cfg.linear_conv_kernel - 1) * cache_bytes + recurrent * state_bytes
    )
    ple_tail = cfg.ple_tail * cfg.hc_count * cfg.hidden_size * cache_bytes
    ple = len(cfg.ple_layer_ids) * (ple_tail + (cfg.ngram_size - 1) * 8)
    return gdn + ple


def _attention_decoder_params(cfg: ModelConfig) -> int:
    """An MTP decoder layer: attention, the MLP (layer index -1), two hyper-connections."""
    return attention_layer_params(cfg) + mlp_params(cfg, -1) + 2 * hyper_connection_params(cfg)


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin: these bases decide every n below 3.3e24."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)
    for p in bases:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True
