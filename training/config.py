"""What the embedded model is and how it trains: the shipped config and the run presets."""

from __future__ import annotations

from dataclasses import dataclass

from training.tokenizer import VOCAB_SIZE


@dataclass(frozen=True, slots=True)
class Preset:
    device: str
    steps: int
    batch_size: int  # windows per step
    seq_len: int  # tokens per window fed to the model (each window holds seq_len + 2)
    lr: float  # peak AdamW learning rate
    warmup: int  # steps of linear warmup, then cosine to lr * min_lr_ratio
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1  # on matrices only
    mtp_weight: float = 0.5  # lambda on the MTP head's CE
    balance_weight: float = 0.01  # Switch-style router balance loss, per MoE layer
    indexer_weight: float = 1.0  # the indexer's KL to dense attention (trains the indexer only)
    grad_clip: float = 1.0
    threads: int = 0  # torch CPU threads (0: leave torch's default)
    max_minutes: float = 12.0  # safety stop; a run that hits it says so in its log
    log_every: int = 10
    eval_every: int = 0  # steps between held-out evaluations (0: only at the end)
    eval_windows: int = 16  # held-out windows for those evaluations (the end uses all)


PRESETS = {
    # fp32, about 10 minutes at ~550 tokens/s. One thread: on a 2-core machine that another
    # process keeps busy, two threads ran tiny ops up to 100x slower (a parallel region waits
    # for its descheduled thread); pass --threads 2 on an idle machine.
    "cpu": Preset(
        device="cpu",
        steps=160,
        batch_size=4,
        seq_len=512,
        lr=3e-3,
        warmup=20,
        threads=1,
        max_minutes=14.0,
    ),
    # One H200, fp32 with TF32 matmuls, about 6 minutes. The corpus is small (~2.2-2.6M
    # tokens): at batch 64 an epoch is ~70 steps, and held-out loss stops improving after
    # ~10 epochs while train loss keeps falling, so the run is capped there, not by time.
    "gpu": Preset(
        device="cuda",
        steps=800,
        batch_size=64,
        seq_len=512,
        lr=2e-3,
        warmup=100,
        max_minutes=9.0,
        log_every=50,
        eval_every=100,
        eval_windows=0,
    ),
}


def tiny_config(vocab_size: int = VOCAB_SIZE) -> dict:
    """The shipped config (transformers 5.17 `qwen4_exp_text` spelling).

    Every Flash Next part at small width: 8 layers = 2 x (3 GDN + 1 QSA), hyper-connections
    with 4 streams, PLE on layer 2 (one-indexed, a GDN layer), QSA with budget 64 and blocks
    of 4 (sparse past 67 tokens), 8 experts top-2 plus a shared expert, one MTP layer.
    """
    return {
        "architectures": ["Qwen4ExpForCausalLM"],
        "model_type": "qwen4_exp_text",
        "vocab_size": vocab_size,
        "hidden_size": 192,
        "num_hidden_layers": 8,
        "layer_types": (["linear_attention"] * 3 + ["qwen_sparse_attention"]) * 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 48,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 48,
        "linear_value_head_dim": 48,
        "linear_conv_kernel_dim": 4,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 128,
        "norm_topk_prob": True,
        "hc_count": 4,
        "hc_lowrank": 16,
        "ple_layer_ids": [2],
        "ple_embed_dim": 96,
        "ple_conv_kernel_size": 4,
        "ngram_size": 3,
        "heads_per_ngram": 2,
        "ngram_vocab_size_base": 4001,
        "make_ngram_vocab_size_divisible_by": 128,
        "split_ngram_parts": 1,
        "seed": 1234,
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 32,
        "indexer_budget": 64,
        "indexer_compress_ratio": 4,
        "output_gate_type": "sigmoid",
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 32768,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 1e7,
            "partial_rotary_factor": 0.25,
            "mrope_section": [2, 2, 2],
            "mrope_interleaved": True,
        },
        "mtp_num_hidden_layers": 1,
        "tie_word_embeddings": False,
        "eos_token_id": 0,
        "bos_token_id": None,
        "pad_token_id": 0,
        "dtype": "bfloat16",
    }
