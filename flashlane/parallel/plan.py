"""The sharding plan: which weights a tensor-parallel rank holds, applied to a built model.

Split across ranks (rank r holds the r-th contiguous block):
- attention heads: q_proj (each head's query and gate rows), k_proj and v_proj (KV heads),
  o_proj's columns; a rank's sessions hold only its KV heads' keys and values. With fewer KV
  heads than ranks (Flash Next has 2) each rank holds the one KV head its query heads read,
  replicated over size / KV heads ranks, as GQA under vLLM's TP does; GDN key heads alike;
- GDN heads: the q, k and v rows of in_proj_qkv and the conv taps (key heads, with the value
  heads each key head serves: gdn_qk repeats a key head over adjacent value heads), in_proj_z,
  in_proj_a, in_proj_b, A_log and dt_bias (value heads), out_proj's columns; a rank's
  sessions hold only its heads' recurrent states and conv windows;
- experts (TP): every expert's and the shared expert's width (gate and up rows, down columns);
  or placed (EP, `expert_parallel`): rank r holds experts r * E / size .. whole, the shared
  expert stays whole on every rank, and the ranks' slot outputs are summed before the slots
  are added (kernels.moe_placed: the same bits as one rank; the CPU's kernels only so far);
- the lm_head by vocabulary rows, the logits gathered (concatenated: the same bits as one
  rank's product, and each rank reads 1/size of the largest dense weight at decode).
Column-parallel input projections need no communication: a rank's heads read only its
columns. Row-parallel outputs (o_proj, out_proj, the MoE block, a dense MLP's down_proj) are
parts, summed over the ranks in rank order (group.all_reduce) where the layer returns.

Replicated on every rank, and why:
- the hyper-connection mixes and every norm: they act on the whole residual, which every
  rank holds; sharding them would add a collective per block to save vectors and a few
  hc*H x lowrank matrices;
- the router (and the shared expert's gate logit): every rank must pick the same experts for
  a row, from the whole x, in fp32 with lower-id ties; it is E x H, small beside the experts;
- the PLE's n-gram table rows and projections: a row reads a handful of table rows and adds
  to every hc stream of the replicated residual; split rows would cost an all-reduce per PLE
  layer for a gather of a few rows (the table stays in host memory on a GPU machine);
- the QSA indexer: one block selection serves all of a layer's heads, so each rank computes it
  whole (its keys are one head wide);
- the token embedding and the MTP head's fc projections (H x H): read once per row.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from flashlane.kernels.linear.fp8 import Fp8Weight
from flashlane.models.config import ModelConfig
from flashlane.models.layers.gated_attention import GatedAttention
from flashlane.models.layers.gated_deltanet import GatedDeltaNet
from flashlane.models.layers.moe import SparseMoe
from flashlane.models.layers.norms import Linear, Stacked
from flashlane.models.layers.plain_decoder import DenseMlp
from flashlane.models.layers.qsa_attention import QSAttention
from flashlane.parallel.group import TensorParallel


class ShardingError(ValueError):
    """A tensor-parallel size the model cannot be split by (names the numbers)."""


def shard_config(cfg: ModelConfig, size: int, placed: bool = False) -> ModelConfig:
    """The config one rank's layers and sessions see: head counts and expert widths divided
    by `size` (with `placed`, expert parallel: the experts' count instead, widths whole).
    Raises ShardingError naming every count `size` does not divide."""
    counts = {
        "attention heads (num_attention_heads)": cfg.num_attention_heads,
        "GDN value heads (linear_num_value_heads)": cfg.linear_num_v_heads,
        "dense MLP width (intermediate_size)": cfg.intermediate_size,
        "vocabulary (vocab_size)": cfg.vocab_size,
    }
    if placed:
        counts["experts (num_experts)"] = cfg.num_experts
    else:
        counts["expert width (moe_intermediate_size)"] = cfg.moe_intermediate_size
        counts["shared expert width (shared_expert_intermediate_size)"] = (
            cfg.shared_expert_intermediate_size
        )
    if size < 1:
        raise ShardingError(f"tensor-parallel size must be >= 1, got {size}")
    bad = [f"{name} {n}" for name, n in counts.items() if n % size]
    # grouped heads: split, or one per rank replicated over size / n ranks
    grouped = {
        "KV heads (num_key_value_heads)": cfg.num_kv_heads,
        "GDN key heads (linear_num_key_heads)": cfg.linear_num_k_heads,
    }
    bad += [f"{name} {n}" for name, n in grouped.items() if n % size and size % n]
    if bad:
        raise ShardingError(
            f"tensor-parallel size {size} does not divide the model's " + ", ".join(bad)
        )
    if size == 1:
        return cfg
    width = 1 if placed else size
    return replace(
        cfg,
        num_attention_heads=cfg.num_attention_heads // size,
        num_kv_heads=max(1, cfg.num_kv_heads // size),
        linear_num_k_heads=max(1, cfg.linear_num_k_heads // size),
        linear_num_v_heads=cfg.linear_num_v_heads // size,
        moe_intermediate_size=cfg.moe_intermediate_size // width,
        shared_expert_intermediate_size=cfg.shared_expert_intermediate_size // width,
        intermediate_size=cfg.intermediate_size // size,
    )


def shard_model(model: nn.Module, tp: TensorParallel, placed: bool = False) -> nn.Module:
    """Cut a built, loaded model (before `use_kernels`: it stacks the sliced weights) down to
    rank tp.rank's part, in place, and point its sharded layers at the group's collectives;
    `placed`: experts placed whole on the ranks (expert parallel), not split. The model code
    is unchanged: its layers read the rank's config."""
    cfg = model.cfg
    local = shard_config(cfg, tp.size, placed)
    if tp.size == 1:
        return model
    for m in list(model.modules()):
        if isinstance(m, GatedDeltaNet):
            _shard_gdn(m, cfg, local, tp)
        elif isinstance(m, QSAttention | GatedAttention):
            _shard_heads(m, cfg, local, tp)
        elif isinstance(m, SparseMoe):
            (_place_moe if placed else _shard_moe)(m, local, tp)
        elif isinstance(m, DenseMlp):
            _rows(m.gate_proj, tp)
            _rows(m.up_proj, tp)
            _columns(m.down_proj, tp, tp.all_reduce)
            _restack(m.gate_up)
    # a tied head gets its own Parameter here: the embedding stays whole
    _rows(model.lm_head, tp)
    model.lm_head.combine = tp.gather_columns
    return model


def _block(w: torch.Tensor, dim: int, tp: TensorParallel, parts: int = 1) -> torch.Tensor:
    """Rank tp.rank's block of w along dim, of each of `parts` equal runs (a copy: the
    full weight's storage can go)."""
    runs = w.chunk(parts, dim=dim)
    return torch.cat([r.chunk(tp.size, dim=dim)[tp.rank] for r in runs], dim=dim).clone()


def _heads(w: torch.Tensor, heads: int, tp: TensorParallel) -> torch.Tensor:
    """Rank tp.rank's rows of a [heads * D, ...] weight of grouped heads: its block, or with
    fewer heads than ranks the one head its query (value) heads read."""
    if heads % tp.size == 0:
        return _block(w, 0, tp)
    d, h = w.shape[0] // heads, tp.rank * heads // tp.size
    return w[h * d : (h + 1) * d].clone()


def _set(module: nn.Module, name: str, w: torch.Tensor) -> None:
    setattr(module, name, nn.Parameter(w, requires_grad=False))


def _rows(lin: Linear, tp: TensorParallel, parts: int = 1) -> None:
    _set(lin, "weight", _block(lin.weight.detach(), 0, tp, parts))
    lin.out_features = lin.weight.shape[0]


def _columns(lin: Linear, tp: TensorParallel, combine) -> None:
    _set(lin, "weight", _block(lin.weight.detach(), 1, tp))
    lin.in_features = lin.weight.shape[1]
    lin.combine = combine


def _restack(stacked: Stacked) -> None:
    stacked.sizes = [m.out_features for m in stacked.linears]
    stacked.weight = None


def _shard_gdn(m: GatedDeltaNet, cfg: ModelConfig, local: ModelConfig, tp: TensorParallel):
    kd, vd = cfg.linear_key_dim, cfg.linear_value_dim

    def qkv(w: torch.Tensor) -> torch.Tensor:  # [conv_dim, ...]: q, k, v runs, each split
        q, k, v = w.split([kd, kd, vd])
        nk = cfg.linear_num_k_heads
        return torch.cat([_heads(q, nk, tp), _heads(k, nk, tp), _block(v, 0, tp)])

    _set(m.in_proj_qkv, "weight", qkv(m.in_proj_qkv.weight.detach()))
    m.in_proj_qkv.out_features = local.linear_conv_dim
    _set(m.conv1d, "weight", qkv(m.conv1d.weight.detach()))
    for lin in (m.in_proj_z, m.in_proj_a, m.in_proj_b):
        _rows(lin, tp)
    _set(m, "A_log", _block(m.A_log.detach(), 0, tp))
    _set(m, "dt_bias", _block(m.dt_bias.detach(), 0, tp))
    _columns(m.out_proj, tp, tp.all_reduce)
    _restack(m.in_proj)
    m.cfg = local


def _shard_heads(m: nn.Module, cfg: ModelConfig, local: ModelConfig, tp: TensorParallel):
    _rows(m.q_proj, tp)  # [heads * 2D]: head h's query and gate rows side by side
    for lin in (m.k_proj, m.v_proj):
        _set(lin, "weight", _heads(lin.weight.detach(), cfg.num_kv_heads, tp))
        lin.out_features = lin.weight.shape[0]
    _columns(m.o_proj, tp, tp.all_reduce)
    _restack(m.in_proj)
    m.cfg = local  # the indexer keeps the whole config: it is replicated


def _shard_moe(m: SparseMoe, local: ModelConfig, tp: TensorParallel) -> None:
    e = m.experts
    _set(e, "gate_proj", _block(e.gate_proj.detach(), 1, tp))
    _set(e, "up_proj", _block(e.up_proj.detach(), 1, tp))
    _set(e, "down_proj", _block(e.down_proj.detach(), 2, tp))
    se = m.shared_expert
    _rows(se.gate_proj, tp)
    _rows(se.up_proj, tp)
    # the shared expert's part is summed with the routed experts' (one all-reduce a block)
    _set(se.down_proj, "weight", _block(se.down_proj.weight.detach(), 1, tp))
    se.down_proj.in_features = se.down_proj.weight.shape[1]
    m.combine = tp.all_reduce
    m.cfg = local


def _place_moe(m: SparseMoe, local: ModelConfig, tp: TensorParallel) -> None:
    """Expert parallel: rank r keeps experts r * E / size .. (r + 1) * E / size - 1 whole; the
    router and the shared expert stay whole (every rank routes every row the same way)."""
    e = m.experts
    if isinstance(e.gate_proj, Fp8Weight):
        raise ShardingError("expert parallel takes bf16 / fp32 experts, not FP8 stacks yet")
    for name in ("gate_proj", "up_proj", "down_proj"):
        _set(e, name, _block(getattr(e, name).detach(), 0, tp))
    m.placed = tp.rank * (local.num_experts // tp.size)
    m.reduce_slots = tp.all_reduce
    m.cfg = local
