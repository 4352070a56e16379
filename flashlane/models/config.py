"""ModelConfig: every spelling of a Flash Next (qwen4_exp) config.json and of its siblings
(qwen3_next, qwen3_5, qwen3_5_moe), read once at the edge.

The rest of flashlane reads only this record. Layer types are normalised to three kinds:
`"linear"` (Gated DeltaNet), `"sparse"` (Flash Next's QSA attention with the block indexer) and
`"full"` (the siblings' gated full attention). A sibling has no hyper-connections (one residual
stream: hc_count 1, hc_lowrank 0), no PLE and no indexer (indexer_head_dim 0); its own fields
are read in `models/config_fields.py` (sibling_fields), as are the field reader, the layer-type
spellings and the checks across fields; ConfigError and the spellings are re-exported here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashlane.models.config_fields import (
    LINEAR_SPELLINGS,
    SPARSE_SPELLINGS,
    ConfigError,
    FieldReader,
    check_fields,
    flashnext_fields,
    read_layer_types,
    sibling_fields,
)

__all__ = [
    "FAMILIES",
    "LINEAR_SPELLINGS",
    "ROOT_MODEL_TYPES",
    "SPARSE_SPELLINGS",
    "TEXT_MODEL_TYPES",
    "ConfigError",
    "ModelConfig",
]

# text model_type -> family: the model file that serves it (models/build.py)
FAMILIES = {
    "qwen4_exp_text": "flashnext",
    "qwen3_8_flash_next": "flashnext",
    "qwen3_next": "qwen3_next",
    "qwen3_5_text": "qwen3_5",
    "qwen3_5_moe_text": "qwen3_5_moe",
}
TEXT_MODEL_TYPES = frozenset(FAMILIES)
# root model_type (a text_config inside, the vision tower beside it) -> its text model_type
ROOT_MODEL_TYPES = {
    "qwen4_exp": "qwen4_exp_text",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
}
SUPPORTED = (
    "flashlane serves Flash Next (model_type qwen4_exp, qwen4_exp_text, qwen3_8_flash_next: "
    "Qwen4ExpForConditionalGeneration, Qwen4ExpForCausalLM), Qwen3-Next (qwen3_next), Qwen3.5 "
    "(qwen3_5, qwen3_5_text) and Qwen3.5-MoE (qwen3_5_moe, qwen3_5_moe_text)"
)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    layer_types: tuple[str, ...]  # "linear" | "sparse" | "full", one per decoder layer
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    rotary_dim: int  # leading dims of each attention/indexer head that get RoPE
    rope_theta: float
    linear_num_k_heads: int
    linear_num_v_heads: int
    linear_k_head_dim: int
    linear_v_head_dim: int
    linear_conv_kernel: int
    num_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    shared_expert_intermediate_size: int
    norm_topk_prob: bool
    hc_count: int
    hc_lowrank: int
    ple_layer_ids: tuple[int, ...]  # zero-indexed here (config.json is one-indexed)
    ple_embed_dim: int
    ple_conv_kernel: int
    ngram_size: int
    heads_per_ngram: int
    ngram_vocab_size_base: int
    ngram_vocab_divisor: int
    ngram_seed: int
    split_ngram_parts: int
    indexer_n_heads: int
    indexer_head_dim: int
    indexer_budget: int  # tokens from complete blocks a query may select
    indexer_block: int  # tokens pooled into one block key (compress ratio)
    output_gate: str  # activation of the GDN gated norm: "sigmoid" | "silu"
    rms_eps: float
    max_position_embeddings: int
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    tie_word_embeddings: bool
    num_mtp_layers: int
    model_type: str = "qwen4_exp_text"
    intermediate_size: int = 0  # the dense MLP's width (siblings' dense layers)
    # zero-indexed layers whose MLP is dense (every layer of qwen3_5; mlp_only_layers)
    dense_mlp_layers: tuple[int, ...] = ()
    # Parameters of parts flashlane does not load (the vision tower), for `flashlane info`.
    vision: dict[str, Any] | None = field(default=None, compare=False)

    @property
    def num_layers(self) -> int:
        return len(self.layer_types)

    @property
    def family(self) -> str:
        """ "flashnext", "qwen3_next", "qwen3_5" or "qwen3_5_moe"."""
        return FAMILIES[self.model_type]

    @property
    def has_hyper_connections(self) -> bool:
        """Flash Next's hc streams; a sibling's residual is one plain pre-norm stream."""
        return self.hc_lowrank > 0

    @property
    def residual_width(self) -> int:
        """The width of a row of the residual the runner carries (hc_count * hidden)."""
        return self.hc_count * self.hidden_size

    @property
    def num_attention_layers(self) -> int:
        """Layers with a KV cache: sparse (QSA) and full (gated) attention."""
        return len(self.layer_types) - self.layer_types.count("linear")

    def is_moe_layer(self, layer_idx: int) -> bool:
        """Whether the layer's MLP is the routed MoE (else the dense MLP); MTP layers pass -1."""
        return self.num_experts > 0 and layer_idx not in self.dense_mlp_layers

    @property
    def ple_eos(self) -> int:
        return self.eos_token_ids[0]

    @property
    def num_ngram_heads(self) -> int:
        return (self.ngram_size - 1) * self.heads_per_ngram

    @property
    def indexer_top_blocks(self) -> int:
        return self.indexer_budget // self.indexer_block

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_k_heads * self.linear_k_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_v_heads * self.linear_v_head_dim

    @property
    def linear_conv_dim(self) -> int:
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def ple_conv_dilation(self) -> int:
        return self.ngram_size

    @property
    def ple_tail(self) -> int:
        """Rows of the PLE dilated conv kept as state: (kernel - 1) * dilation."""
        return (self.ple_conv_kernel - 1) * self.ple_conv_dilation

    @classmethod
    def from_hf(cls, source: str | Path | dict[str, Any]) -> ModelConfig:
        """Read a config.json (a path to the file or its folder, or the parsed dict)."""
        if isinstance(source, dict):
            return _parse(source, "<dict>")
        path = Path(source)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"{path}: no config.json there") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the top level must be a JSON object")
        return _parse(raw, str(path))


def _parse(raw: dict[str, Any], where: str) -> ModelConfig:
    model_type = raw.get("model_type")
    vision = None
    if model_type in ROOT_MODEL_TYPES:
        text = raw.get("text_config")
        if not isinstance(text, dict):
            raise ConfigError(f"{where}: field 'text_config' must be an object for {model_type}")
        vision = raw.get("vision_config") if isinstance(raw.get("vision_config"), dict) else None
        text = dict(text)
        for key in ("eos_token_id", "tie_word_embeddings"):
            if text.get(key) is None and raw.get(key) is not None:
                text[key] = raw[key]
        model_type = text.get("model_type", ROOT_MODEL_TYPES[model_type])
        raw = text
    if model_type not in TEXT_MODEL_TYPES:
        raise ConfigError(f"{where}: field 'model_type' is {model_type!r}; {SUPPORTED}")
    family = FAMILIES[model_type]
    r = FieldReader(raw, where)
    hidden = r.int("hidden_size")
    num_layers = r.int("num_hidden_layers")
    layer_types = read_layer_types(raw, num_layers, where, family)
    num_heads = r.int("num_attention_heads")
    head_dim = r.int("head_dim", hidden // num_heads)
    rope = raw.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"{where}: field 'rope_parameters' must be an object")
    rope_theta = float(rope.get("rope_theta", raw.get("rope_theta", 10000.0)))
    # the siblings' configs default to a quarter (Qwen3NextConfig.__post_init__)
    partial_default = 1.0 if family == "flashnext" else 0.25
    partial = float(
        rope.get("partial_rotary_factor", raw.get("partial_rotary_factor", partial_default))
    )
    rope_type = rope.get("rope_type", "default")
    if rope_type != "default":
        raise ConfigError(
            f"{where}: field 'rope_parameters.rope_type' {rope_type!r} is not supported"
        )
    rotary_dim = int(head_dim * partial)
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    ple_one = raw.get("ple_layer_ids") or []
    if not isinstance(ple_one, list) or not all(isinstance(i, int) for i in ple_one):
        raise ConfigError(f"{where}: field 'ple_layer_ids' must be a list of ints")
    for i in ple_one:
        if not 1 <= i <= num_layers:
            raise ConfigError(f"{where}: field 'ple_layer_ids' holds {i}, outside 1..{num_layers}")
        if layer_types[i - 1] != "linear":
            raise ConfigError(f"{where}: field 'ple_layer_ids' puts PLE on layer {i}, not linear")
    if ple_one and not eos_ids:
        raise ConfigError(f"{where}: field 'eos_token_id' must be set when PLE layers are enabled")
    gate = raw.get("output_gate_type") or raw.get("hidden_act", "silu")
    if gate not in ("sigmoid", "silu"):
        raise ConfigError(f"{where}: field 'output_gate_type' {gate!r} is not sigmoid or silu")
    if raw.get("hidden_act", "silu") != "silu":
        raise ConfigError(f"{where}: field 'hidden_act' must be 'silu'")
    if family == "flashnext":
        own = flashnext_fields(raw, r, hidden, ple_one)
        mtp_default = 1
    else:
        own = sibling_fields(raw, r, family, num_layers, where)
        # Qwen3.5 spells it mtp_num_hidden_layers; vLLM reads Qwen3-Next's as
        # num_nextn_predict_layers; absent, one (the loader drops it without mtp.*)
        mtp_default = raw.get("num_nextn_predict_layers", 1)
    cfg = ModelConfig(
        vocab_size=r.int("vocab_size"),
        hidden_size=hidden,
        layer_types=layer_types,
        num_attention_heads=num_heads,
        num_kv_heads=r.int("num_key_value_heads"),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rope_theta=rope_theta,
        linear_num_k_heads=r.int("linear_num_key_heads"),
        linear_num_v_heads=r.int("linear_num_value_heads"),
        linear_k_head_dim=r.int("linear_key_head_dim"),
        linear_v_head_dim=r.int("linear_value_head_dim"),
        linear_conv_kernel=r.int("linear_conv_kernel_dim", 4),
        output_gate=gate,
        rms_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=r.int("max_position_embeddings"),
        eos_token_ids=eos_ids,
        bos_token_id=raw.get("bos_token_id"),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        num_mtp_layers=r.int("mtp_num_hidden_layers", mtp_default, allow_zero=True),
        model_type=model_type,
        vision=vision,
        **own,
    )
    check_fields(cfg, raw, where)
    return cfg
