"""Roofline accounting (DESIGN.md section 9): what a decode round must read and what a prefill
must compute, and the machine's measured ceilings to divide them by.

Random weights route tokens evenly over experts, so the distinct experts a round reads are
counted as the expectation under uniform routing: E * (1 - (1 - k/E)^rows) per layer.
"""

from __future__ import annotations

import time

import torch

from flashlane.models import census
from flashlane.models.config import ModelConfig
from flashlane.models.fp8 import QuantSpec


def expected_experts(cfg: ModelConfig, rows: int) -> float:
    """Distinct experts a round of `rows` rows reads in one MoE layer (0 without experts)."""
    e, k = cfg.num_experts, cfg.num_experts_per_tok
    return e * (1.0 - (1.0 - k / e) ** rows) if e else 0.0


def decode_round_bytes(
    cfg: ModelConfig,
    rows: int,
    context: int,
    weight_bytes: int = 2,
    fp8: QuantSpec | None = None,
    table_int8: bool = False,
    kv_fp8: bool = False,
) -> dict:
    """Bytes one decode round of `rows` streams (one row each) moves, by part. fp8: the
    weights that spec converts (every routed expert, and the dense linears it does not
    leave) at one byte a value plus their float32 block scales, the rest at weight_bytes;
    the n-gram table rows at weight_bytes wherever the table lives (host rows cross the bus
    to the GPU: the same bytes), or with table_int8 at one byte a value plus a float32
    scale a table row (models/table8.py). kv_fp8: the attention caches as an 8-bit cache
    stores them (attention_bytes)."""
    p = census.count_params(cfg)
    layers = sum(map(cfg.is_moe_layer, range(cfg.num_layers)))  # the MoE layers
    expert = census.expert_params(cfg)
    # every weight but the experts' and the tables' is read once per round
    dense = p.text - p.experts - p.embeddings
    experts = layers * expected_experts(cfg, rows) * expert
    embed_rows = rows * cfg.hidden_size
    ple_rows = rows * len(cfg.ple_layer_ids) * cfg.ple_embed_dim
    state = rows * census.state_bytes_per_stream(cfg) * 2  # read and written
    kv = rows * attention_bytes(cfg, context, kv_fp8=kv_fp8)
    width = cfg.ple_embed_dim // max(cfg.num_ngram_heads, 1)
    table = ple_rows * (1 + 4 / width) if table_int8 else ple_rows * weight_bytes
    if fp8 is None:
        weights = (dense + experts + embed_rows) * weight_bytes + table
    else:
        converted = converted_dense_params(cfg, fp8)
        per_fp8 = 1 + 4 / (fp8.block[0] * fp8.block[1])
        plain = dense - converted + embed_rows
        weights = round(plain * weight_bytes + table + (converted + experts) * per_fp8)
    parts = {
        "weights": weights,
        "state": state,
        "kv": kv,
    }
    parts["total"] = sum(parts.values())
    return parts


def converted_dense_params(cfg: ModelConfig, spec: QuantSpec) -> int:
    """The text model's dense (not routed-expert, not embedding, not MTP) parameters that a
    block-FP8 checkpoint of `spec` stores in e4m3: its 2-D linears spec converts."""
    from flashlane.models.build import build_model

    with torch.device("meta"):
        model = build_model(cfg)
    total = 0
    for name, p in model.named_parameters():
        if name.startswith("mtp.") or ".experts." in name or p.ndim != 2:
            continue
        hf = name if name.startswith("lm_head.") else "model." + name
        if spec.is_converted(hf):
            total += p.numel()
    return total


def attention_bytes(
    cfg: ModelConfig, context: int, cache_bytes: int = 2, kv_fp8: bool = False
) -> int:
    """What one row's attention layers read at `context` positions: a sparse layer scores
    every complete block's pooled indexer key, pools its current block again from that
    block's raw keys, and reads K and V of the keys it selects (all of them up to its budget,
    indexer_top_blocks blocks); a full (gated) layer reads K and V of every key. kv_fp8: K,
    V and raw keys at one byte a value plus an fp32 scale a row and head (models/state.py),
    the pooled keys at cache_bytes."""
    stored = (1, 4) if kv_fp8 else (cache_bytes, 0)  # bytes a value, bytes a row's scale
    kv_token = 2 * cfg.num_kv_heads * (cfg.head_dim * stored[0] + stored[1])  # K, V a layer
    block, key = cfg.indexer_block, cfg.indexer_head_dim * cache_bytes
    raw = cfg.indexer_head_dim * stored[0] + stored[1]
    budget = cfg.indexer_top_blocks * block
    sparse = min(context, budget) * kv_token + (context // block) * key + min(context, block) * raw
    full = context * kv_token
    return cfg.layer_types.count("sparse") * sparse + cfg.layer_types.count("full") * full


def prefill_flops(cfg: ModelConfig, tokens: int) -> float:
    """2 x active parameters x tokens + causal attention over the sparse layers' selected keys
    and over every earlier key of the full (gated) attention layers."""
    p = census.count_params(cfg)
    active = p.active - cfg.hidden_size  # the embedding row is a gather, not a product
    sparse, full = cfg.layer_types.count("sparse"), cfg.layer_types.count("full")
    budget = cfg.indexer_top_blocks * cfg.indexer_block
    # query t attends min(t + 1, budget) keys: QK^T and PV, 2 FLOPs per multiply-add
    keys = sum(min(t + 1, budget) for t in range(0, tokens, 64)) * 64
    every = sum(t + 1 for t in range(0, tokens, 64)) * 64
    attn = (sparse * keys + full * every) * 4 * cfg.num_attention_heads * cfg.head_dim
    return 2.0 * active * tokens + attn


def measure_ceilings(device: str = "cuda", fp8: bool = False) -> dict:
    """Copy bandwidth (bytes read + written per second) and the bf16 matrix rate, measured;
    with `fp8` also the e4m3 matrix rate (torch._scaled_mm, fp32 accumulation: the rate an
    FP8 model's prefill is held to), None where this torch or GPU has none."""
    n = 1 << 30  # 1 GiB per buffer: far past the L2
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    m = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

    def timed(fn, reps):
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / reps

    copy_s = timed(lambda: b.copy_(a), 20)
    mm_s = timed(lambda: m @ m, 10)
    out = {"bandwidth_Bps": 2 * n / copy_s, "bf16_flops": 2 * 8192**3 / mm_s}
    if fp8:
        out["fp8_flops"] = _fp8_rate(m, timed)
    return out


def _fp8_rate(m: torch.Tensor, timed) -> float | None:
    """e4m3 x e4m3 -> bf16 products of m's size per second (the second operand column-major,
    as _scaled_mm takes it), None where _scaled_mm is missing or refuses."""
    try:
        q = m.to(torch.float8_e4m3fn)
        one = torch.ones((), device=m.device, dtype=torch.float32)
        run = lambda: torch._scaled_mm(q, q.t(), one, one, out_dtype=torch.bfloat16)  # noqa: E731
        return 2 * m.shape[0] ** 3 / timed(run, 10)
    except (AttributeError, RuntimeError):
        return None
