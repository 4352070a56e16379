"""What each part takes in bytes, from the ModelConfig: a session's buffers, the shared verify
scratch, the activation allowance and the weights.

No torch. `session_buffers` lists every buffer the runner allocates for one session (its
allocation test compares them with real tensors); the workspace is the verify scratch shared by
all sessions plus a stated activation allowance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from flashlane.models.config import ModelConfig

# the weights' bytes are the model's census; the plan names them here with the other parts
from flashlane.models.weight_bytes import weight_bytes as weight_bytes

GIB = 2**30
MIB = 2**20
# Element sizes of session buffers: (KV / conv cache, recurrent state) per device.
ELEMENT_BYTES = {"cuda": (2, 4), "cpu": (8, 8)}  # bf16 / fp32 on the GPU, fp64 on the CPU
# Activations beside the fp32 logits of a round (hidden states, MoE buffers, graph pools).
ACTIVATION_FIXED = {"cuda": GIB, "cpu": 64 * MIB}
# Prompt rows a round takes at most (the host's pieces, the backend's limit): GPU GEMMs want
# long pieces (each reads every expert's weights once a layer); CPU rounds stay short.
PREFILL_ROWS = {"cuda": 8192, "cpu": 1024}
# where memory is short the plan halves the pieces down to this before it gives up sessions
MIN_PREFILL_ROWS = {"cuda": 2048, "cpu": 256}


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str  # "<part>.<field>" as in models/state.py: "attn.k", "mtp.v", "gdn.recurrent", ...
    shape: tuple[int, ...]
    itemsize: int  # bytes per element
    count: int  # how many layers hold one

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize * self.count


def element_bytes(device: str) -> tuple[int, int]:
    """(cache_bytes, state_bytes) for a device: (2, 4) on cuda, (8, 8) on the CPU."""
    if device not in ELEMENT_BYTES:
        raise ValueError(f"device must be one of {sorted(ELEMENT_BYTES)}, got {device!r}")
    return ELEMENT_BYTES[device]


def session_buffers(
    cfg: ModelConfig,
    capacity: int,
    cache_bytes: int,
    state_bytes: int,
    mtp: bool = True,
    kv_fp8: bool = False,
) -> tuple[Buffer, ...]:
    """Every buffer of one session of `capacity` positions (drafts off: mtp=False); kv_fp8:
    K, V and indexer keys in e4m3 with an fp32 scale a row and head (models/state.py), the
    pooled block keys in the compute dtype."""
    kv = (capacity, cfg.num_kv_heads, cfg.head_dim)
    keys = (capacity, cfg.indexer_head_dim)
    blocks = (capacity // cfg.indexer_block, cfg.indexer_head_dim)
    stored = 1 if kv_fp8 else cache_bytes
    out = []
    for prefix, count in (
        ("attn", cfg.num_attention_layers),
        ("mtp", cfg.num_mtp_layers if mtp else 0),
    ):
        out += [
            Buffer(f"{prefix}.k", kv, stored, count),
            Buffer(f"{prefix}.v", kv, stored, count),
            Buffer(f"{prefix}.index_keys", keys, stored, count),
            Buffer(f"{prefix}.block_keys", blocks, cache_bytes, count),
        ]
        if kv_fp8:
            out += [
                Buffer(f"{prefix}.k_scale", kv[:2], 4, count),
                Buffer(f"{prefix}.v_scale", kv[:2], 4, count),
                Buffer(f"{prefix}.index_scale", (capacity,), 4, count),
            ]
    num_linear = cfg.layer_types.count("linear")
    recurrent = (cfg.linear_num_v_heads, cfg.linear_k_head_dim, cfg.linear_v_head_dim)
    conv = (cfg.linear_conv_kernel - 1, cfg.linear_conv_dim)
    num_ple = len(cfg.ple_layer_ids)
    out += [
        Buffer("gdn.conv", conv, cache_bytes, num_linear),
        Buffer("gdn.recurrent", recurrent, state_bytes, num_linear),
        Buffer("ple.conv", (cfg.ple_tail, cfg.hc_count * cfg.hidden_size), cache_bytes, num_ple),
        Buffer("ple.ids", (cfg.ngram_size - 1,), 8, num_ple),
    ]
    return tuple(b for b in out if b.count > 0)


def session_bytes(
    cfg: ModelConfig,
    capacity: int,
    cache_bytes: int,
    state_bytes: int,
    mtp: bool = True,
    kv_fp8: bool = False,
) -> int:
    buffers = session_buffers(cfg, capacity, cache_bytes, state_bytes, mtp, kv_fp8)
    return sum(b.nbytes for b in buffers)


def scratch_buffers(
    cfg: ModelConfig, max_rows: int, cache_bytes: int, state_bytes: int
) -> tuple[Buffer, ...]:
    """The verify scratch shared by all sessions: per linear layer, a GDN state and a conv row
    for every window row of a round."""
    num_linear = cfg.layer_types.count("linear")
    recurrent = (cfg.linear_num_v_heads, cfg.linear_k_head_dim, cfg.linear_v_head_dim)
    return (
        Buffer("scratch.gdn_state", (max_rows, *recurrent), state_bytes, num_linear),
        Buffer("scratch.gdn_conv", (max_rows, cfg.linear_conv_dim), cache_bytes, num_linear),
    )


def activation_bytes(
    cfg: ModelConfig, max_rows: int, device: str, prompt_rows: int = 0, context: int = 0
) -> int:
    """The stated allowance: a round's fp32 logits plus ACTIVATION_FIXED[device], plus
    prompt_rows x prompt_row_bytes when prompt pieces are that long, plus on a GPU the
    decode rows' split attention partials at this context (split_partial_bytes)."""
    rows = prompt_rows * prompt_row_bytes(cfg, device, context) if prompt_rows else 0
    split = split_partial_bytes(cfg, max_rows, context) if device != "cpu" else 0
    return max_rows * cfg.vocab_size * 4 + ACTIVATION_FIXED[device] + rows + split


def split_partial_bytes(cfg: ModelConfig, rows: int, context: int) -> int:
    """A decode attention call's scratch: the split walk's partials (kernels/attention/
    triton_walk.py: fp32 m, l and a head_dim accumulator for every (row, query head) and
    range of SPLIT_KEYS keys; none while the context is one range), and the gathered
    attention's lists (triton_gather.py: int16 offsets, SPLIT_KEYS a (row, kv head) and
    range); or the listed attention's, if more (triton_listed.py: LISTED_SLICES partials at
    any context, lists without the kv heads): counted whether or not it is switched on."""
    if cfg.family != "flashnext":  # the siblings' attention neither splits nor gathers
        return 0
    splits = -(-context // SPLIT_KEYS)
    lists = splits * rows * cfg.num_kv_heads * SPLIT_KEYS * 2
    partials = max(splits if splits > 1 else 0, LISTED_SLICES)
    return partials * rows * cfg.num_attention_heads * (cfg.head_dim + 2) * 4 + lists


# a session's row of the lone driver's keyed-draw buffers: bytes a vocabulary id (held fp32
# logits, int32 reply counts, bool prompt ids) and besides (1,024 bias ids and float64 values)
# (sampling/vocab_rows.BYTES_PER_ID, BYTES_PER_ROW; tests/planning/test_draw_rows.py checks)
DRAW_BYTES_PER_ID, DRAW_BYTES_PER_ROW = 9, 16384


def draw_row_bytes(cfg: ModelConfig, device: str) -> int:
    """What a session adds to the lone driver's keyed-draw buffers (sampling/vocab_rows.py),
    made on a GPU only (the fused draw's), whatever the session's size."""
    row = cfg.vocab_size * DRAW_BYTES_PER_ID + DRAW_BYTES_PER_ROW
    return row if device.startswith("cuda") else 0


# the decode walk's range of keys (kernels/attention/triton_walk.SPLIT_KEYS; the planning
# stays free of triton: tests/planning/test_split_bytes.py checks they agree)
SPLIT_KEYS = 2048
LISTED_SLICES = 32  # kernels/attention/triton_listed.SLICES (the same test checks it)


def prompt_row_bytes(cfg: ModelConfig, device: str, context: int) -> int:
    """What one prompt row adds to a round's transient memory, estimated with room to spare:
    the residual and its hyper-connection copies (8 of hc x H), the MoE's pairs (k routed and
    the shared expert's, kernels.moe_shared: rows of H out and 3I in), the GDN's chunk states
    (an fp32 state a value head every 64 rows) and its projections (4 of the conv width), the
    indexer's mask over the context."""
    c = ELEMENT_BYTES[device][0]
    residual = 8 * cfg.residual_width * c
    moe = (cfg.num_experts_per_tok + 1) * (cfg.hidden_size + 3 * cfg.moe_intermediate_size) * c
    state = cfg.linear_num_v_heads * cfg.linear_k_head_dim * cfg.linear_v_head_dim * 4 // 64
    return residual + moe + state + 4 * cfg.linear_conv_dim * c + context
