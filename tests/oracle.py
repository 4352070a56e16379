"""Tiny oracle checkpoints: transformers' qwen4_exp and its siblings (qwen3_next, qwen3_5,
qwen3_5_moe) with every parameter randomised.

Default init leaves norms at identity and the PLE conv at zero, which hides bugs, so every
parameter is drawn at random. `with_mtp` adds random `mtp.*` weights (transformers drops
them on load, so the oracle never sees them).
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch

from flashlane.models.random_weights import transformers_classes

ROPE = {
    "rope_type": "default",
    "rope_theta": 1e7,
    "partial_rotary_factor": 0.25,
    "mrope_section": [2, 1, 1],
    "mrope_interleaved": True,
}

TINY = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=32,
    hc_count=4,
    hc_lowrank=8,
    ple_layer_ids=[2],
    ple_embed_dim=64,
    ple_conv_kernel_size=4,
    ngram_size=3,
    heads_per_ngram=2,
    ngram_vocab_size_base=1000,
    make_ngram_vocab_size_divisible_by=128,
    split_ngram_parts=4,
    indexer_n_heads=2,
    indexer_kv_heads=1,
    indexer_head_dim=16,
    indexer_budget=8,
    indexer_compress_ratio=4,
    output_gate_type="sigmoid",
    hidden_act="silu",
    max_position_embeddings=512,
    tie_word_embeddings=False,
    eos_token_id=1,
    bos_token_id=1,
    rope_parameters=ROPE,
)

# Changes layer count and order, stream count, PLE placement (two PLE layers), the GDN
# head ratio, the rotary share and the indexer budget.
OTHER = dict(
    TINY,
    num_hidden_layers=6,
    layer_types=[
        "linear_attention",
        "qwen_sparse_attention",
        "linear_attention",
        "linear_attention",
        "full_attention",
        "linear_attention",
    ],
    hc_count=3,
    hc_lowrank=6,
    ple_layer_ids=[1, 4],
    ple_embed_dim=48,
    heads_per_ngram=3,
    ngram_size=3,
    linear_num_key_heads=1,
    linear_num_value_heads=3,
    indexer_budget=12,
    indexer_n_heads=3,
    num_experts=6,
    num_experts_per_tok=3,
    eos_token_id=2,
    bos_token_id=2,
    rope_parameters=dict(ROPE, partial_rotary_factor=0.5, mrope_section=[4, 2, 2]),
    split_ngram_parts=2,
)


SIBLING_ROPE = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}
SIBLING = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention"] * 3 + ["full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
    hidden_act="silu",
    max_position_embeddings=512,
    tie_word_embeddings=False,
    eos_token_id=1,
    bos_token_id=1,
    rope_parameters=SIBLING_ROPE,
)
# Qwen3-Next: fused GDN projections, one dense layer (mlp_only_layers), a shared expert wider
# than the routed ones (so it runs beside them, not stacked with them)
QWEN3_NEXT = dict(
    SIBLING, model_type="qwen3_next", num_experts=8, num_experts_per_tok=2,
    moe_intermediate_size=32, shared_expert_intermediate_size=48, intermediate_size=96,
    mlp_only_layers=[1], decoder_sparse_step=1, norm_topk_prob=True,
)  # fmt: skip
# Qwen3.5 dense: tied embeddings, another layer order, one key head for three value heads,
# one KV head, half the head rotated, the text config's mRoPE sections (text positions only)
QWEN3_5 = dict(
    SIBLING, model_type="qwen3_5_text", num_hidden_layers=5,
    layer_types=["linear_attention", "full_attention", "linear_attention",
                 "linear_attention", "full_attention"],
    intermediate_size=96, tie_word_embeddings=True, num_key_value_heads=1,
    linear_num_key_heads=1, linear_num_value_heads=3, eos_token_id=2, bos_token_id=2,
    rope_parameters=dict(SIBLING_ROPE, partial_rotary_factor=0.5, mrope_section=[4, 2, 2],
                         mrope_interleaved=True),
)  # fmt: skip
# Qwen3.5-MoE: top-3 of 6 experts, the shared expert as wide as a routed one
QWEN3_5_MOE = dict(
    SIBLING, model_type="qwen3_5_moe_text", num_experts=6, num_experts_per_tok=3,
    moe_intermediate_size=32, shared_expert_intermediate_size=32,
    rope_parameters=dict(SIBLING_ROPE, mrope_section=[2, 1, 1], mrope_interleaved=True),
)  # fmt: skip
SIBLINGS = {"qwen3_next": QWEN3_NEXT, "qwen3_5": QWEN3_5, "qwen3_5_moe": QWEN3_5_MOE}
# the checkpoints the exactness gates run on (conftest's oracle_by_name names): Flash Next's
# tiny one and each sibling's
GATE_CHECKPOINTS = ["tiny", *sorted(SIBLINGS)]


def hf_classes(model_type: str):
    """transformers' (causal LM class, config class) for a text model_type."""
    return transformers_classes(model_type)


def build_oracle(folder: Path, spec: dict, seed: int = 0, with_mtp: bool | None = None) -> Path:
    """Save a randomised transformers checkpoint of spec's model_type (qwen4_exp unless it
    says otherwise), plus random mtp.*, to folder. `with_mtp` None follows the spec's
    `mtp_num_hidden_layers` (absent: with MTP)."""
    if with_mtp is None:
        with_mtp = spec.get("mtp_num_hidden_layers", 1) > 0
    spec = dict(spec)
    model_class, config_class = hf_classes(spec.pop("model_type", "qwen4_exp_text"))
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = model_class(config_class(**spec))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.uniform_(-1.0, 1.5)
            else:
                p.normal_(0.0, 0.2 if p.ndim > 1 else 0.3)
    model.save_pretrained(folder)
    if with_mtp:
        _add_mtp(folder, seed)
    return folder


def _add_mtp(folder: Path, seed: int) -> None:
    from safetensors.torch import load_file, save_file

    from flashlane.models.build import build_model
    from flashlane.models.config import ModelConfig
    from flashlane.models.loader import hf_tensors

    raw = json.loads((folder / "config.json").read_text())
    raw["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(raw, indent=2))
    torch.manual_seed(seed + 1)
    model = build_model(ModelConfig.from_hf(raw))
    with torch.no_grad():
        for p in model.mtp.parameters():
            p.normal_(0.0, 0.2 if p.ndim > 1 else 0.3)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors.update({n: t for n, t in hf_tensors(model).items() if n.startswith("mtp.")})
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@contextmanager
def lower_id_ties():
    """torch.topk leaves the order of equal values unspecified; the indexer's relu makes
    exact ties (zero scores) common. Give the oracle a topk that breaks them toward the
    lower id, the rule flashlane fixes (REFERENCE.md section 2)."""
    original = torch.Tensor.topk

    def topk(self, k, dim=-1, largest=True, sorted=True):
        idx = torch.sort(self, dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k)
        return torch.return_types.topk((self.gather(dim, idx), idx))

    torch.Tensor.topk = topk
    try:
        yield
    finally:
        torch.Tensor.topk = original
