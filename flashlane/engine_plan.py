"""The engine's memory plan from its options (`plan_for`), and where the n-gram tables go
when --ple-table-device is auto (`table_place_for`): the GPU when the plan fits with them
there, else host memory. Read once, at engine start (engine.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from flashlane.config import EngineConfig
from flashlane.lanes.core import COPY_DRAFTS, LaneConfig
from flashlane.models.config import ModelConfig
from flashlane.models.host_tables import TablePlace, table_place
from flashlane.models.table8 import TableDtype, choose_table_dtype
from flashlane.planning import memory
from flashlane.planning.limits import read_ram_bytes
from flashlane.planning.shorter import with_shorter
from flashlane.sessions.slots import parse_slot_contexts

__all__ = [
    "auto_kv_fp8",
    "check_kv_fp8_device",
    "kv_fp8_for",
    "plan_for",
    "table_dtype_for",
    "table_place_for",
]


def kv_fp8_for(
    c: EngineConfig, cache_dtype: torch.dtype, model=None, device: str = "cpu", kernels: str = ""
) -> bool:
    """Whether the attention caches are 8-bit: --kv-cache-dtype fp8 (on the Triton kernels,
    a GPU that converts e4m3: check_kv_fp8_device), or auto with `model`'s weights in block
    FP8 (`auto_kv_fp8`); bf16 is the caches' compute dtype named, refused where the compute
    dtype is another (the CPU computes in float64, and the kernels read a cache in the
    dtype they compute in). Without `model` (before the load): the flags' checks alone."""
    if c.kv_cache_dtype == "bf16" and cache_dtype != torch.bfloat16:
        raise ValueError(
            f"--kv-cache-dtype bf16: the caches are kept in the compute dtype, {cache_dtype} "
            "here (the CPU computes in float64; on cuda --dtype float32 or float64), and a "
            "cache in another dtype is not supported: use auto or fp8"
        )
    if c.kv_cache_dtype == "fp8" and kernels == "triton":
        check_kv_fp8_device(device)
    auto = c.kv_cache_dtype == "auto" and model is not None
    return memory.kv_fp8_planned(c.kv_cache_dtype, auto and auto_kv_fp8(model, device), device)


def auto_kv_fp8(model, device: str) -> bool:
    """Whether --kv-cache-dtype auto keeps 8-bit caches for `model` here
    (memory.kv_fp8_planned): its weights block FP8 on a GPU that converts e4m3 (the full
    Flash Next on one H200: 16 sessions of 32,768 beside its weights, where caches in bf16
    leave room for 10)."""
    from flashlane.models.fp8_weights import fp8_weights

    if not device.startswith("cuda") or not fp8_weights(model):
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


def check_kv_fp8_device(device: str) -> None:
    """An 8-bit cache on the Triton kernels needs a GPU that converts e4m3 (compute
    capability 8.9: Ada, Hopper); the torch references convert it anywhere."""
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        raise ValueError(
            f"--kv-cache-dtype fp8: the Triton kernels read e4m3 on GPUs of compute "
            f"capability 8.9 or later (Ada, Hopper); this one is {major}.{minor}: use "
            "--kv-cache-dtype auto, or --kernels reference (slow)"
        )


def window_rows(c: EngineConfig, mtp: bool) -> int:
    """The widest window a stream verifies (1 + its longest draft: MTP's chain or a copy),
    for rows sized to the sessions; 0 where --max-rows fixes them."""
    if c.max_rows is not None:
        return 0
    return lane_drafts(c, mtp).widest_window


def lane_drafts(c: EngineConfig, mtp: bool) -> LaneConfig:
    """The lane core's draft depths for these options: MTP chains where the model has a
    head, copies of COPY_DRAFTS; none with drafts off."""
    return LaneConfig(
        mtp_drafts=c.mtp_drafts if c.drafts and mtp else 0,
        copy_drafts=COPY_DRAFTS if c.drafts else 0,
    )


def table_place_for(
    c: EngineConfig, cfg: ModelConfig, path: Path, device: str, max_rows: int
) -> TablePlace:
    """Where the n-gram tables go (--ple-table-device; auto: the GPU when the memory plan
    fits with them there, from the config's parameter counts, else the host); int8 tables
    (--ple-table-dtype int8) live in host memory only."""
    if c.ple_table_dtype == "int8":
        return "host"
    if c.ple_table_device in ("cpu", "cuda") or not device.startswith("cuda"):
        return table_place(c.ple_table_device, device, True)
    from flashlane.models.census import count_params
    from flashlane.models.fp8 import QuantizationError, QuantSpec, read_quant_spec
    from flashlane.models.weight_bytes import fp8_bytes

    try:
        spec = read_quant_spec(path) or (QuantSpec() if c.quantization == "fp8" else None)
    except QuantizationError:
        return "device"  # the loader reports the checkpoint's error, naming the file
    table = 2 * count_params(cfg).ngram_table
    mtp = c.drafts and cfg.num_mtp_layers > 0
    text = (
        fp8_bytes(cfg, spec).total_bytes - table
        if spec is not None
        else memory.weight_bytes(cfg, 2, table=False, mtp=mtp)
    )
    try:
        kv8 = memory.kv_fp8_planned(c.kv_cache_dtype, spec is not None, device)
        plan_for(c, cfg, device, max_rows, cfg.num_mtp_layers > 0, text + table, 0, kv_fp8=kv8)
    except memory.OverMemoryLimit:
        return table_place(None, device, False)
    return table_place(None, device, True)


def table_dtype_for(requested: str, cfg: ModelConfig, place: TablePlace, elem: int) -> TableDtype:
    """--ple-table-dtype for tables at `place` whose values take `elem` bytes unquantized
    (the weights'); auto: int8 where the host's ceiling (RAM_FRACTION of RAM) holds the
    8-bit tables and not these (table8.choose_table_dtype, which logs it)."""
    from flashlane.models.census import count_params

    values = count_params(cfg).ngram_table
    width = cfg.ple_embed_dim // max(cfg.num_ngram_heads, 1)
    limit = int(memory.RAM_FRACTION * read_ram_bytes()) if place == "host" else None
    return choose_table_dtype(requested, place == "host", values, width, elem, limit)


def plan_for(
    c: EngineConfig,
    cfg: ModelConfig,
    device: str,
    max_rows: int,
    mtp: bool,
    weight_bytes: int,
    host_bytes: int,
    host_dtype: TableDtype = "bf16",
    kv_fp8: bool | None = None,
) -> memory.MemoryPlan:
    """The memory plan for `weight_bytes` on the device and `host_bytes` of n-gram tables
    in host memory (planned against RAM_FRACTION of RAM), their values in `host_dtype`;
    mtp: the model has an MTP head; up to `max_rows` decode rows a round (no more than the
    sessions fill unless --max-rows is given: window_rows); kv_fp8: 8-bit attention caches
    (None: as --kv-cache-dtype fp8 asks)."""
    if kv_fp8 is None:
        kv_fp8 = c.kv_cache_dtype == "fp8"
    context = c.context or cfg.max_position_embeddings
    # an empty list given is refused (parse_slot_contexts), never taken as unset
    slots = None if c.slot_contexts is None else parse_slot_contexts(c.slot_contexts)
    parallel = None if c.parallel == "auto" else int(c.parallel)
    memory.check_options(
        model_window=cfg.max_position_embeddings,
        max_rows=max_rows,
        mtp_drafts=c.mtp_drafts,
        drafts=c.drafts,
        context=c.context,
        slot_contexts=slots,
        parallel=parallel,
        slot_grow=c.slot_grow,
    )
    kind = "cuda" if device.startswith("cuda") else "cpu"
    gpu_total = torch.cuda.get_device_properties(device).total_memory if kind == "cuda" else None
    limit_gb = c.memory_limit_gb
    if limit_gb is None and c.gpu_memory_utilization is not None:
        total = gpu_total if kind == "cuda" else read_ram_bytes()
        limit_gb = c.gpu_memory_utilization * total / memory.GIB
    limit = memory.resolve_limit_bytes(limit_gb, {}, kind, gpu_total)
    cache_bytes = memory.resolve_prompt_cache_bytes(c.prompt_cache_gb, kind, limit)
    host_limit = int(memory.RAM_FRACTION * read_ram_bytes()) if host_bytes else None
    got = memory.plan_fitting(
        cfg,
        device=kind,
        limit_bytes=limit,
        weight_bytes=weight_bytes,
        host_bytes=host_bytes,
        host_limit_bytes=host_limit,
        host_dtype=host_dtype,
        max_rows=max_rows,
        window_rows=window_rows(c, mtp),
        context=context,
        slot_contexts=slots,
        parallel=parallel,
        mtp=mtp,
        prompt_cache_bytes=cache_bytes,
        prompt_rows=memory.PREFILL_ROWS[kind],
        kv_fp8=kv_fp8,
        prompt_cache_auto=c.prompt_cache_gb is None,
    )

    def at(context: int) -> memory.MemoryPlan:
        shorter = dataclasses.replace(c, context=context)
        return plan_for(
            shorter, cfg, device, max_rows, mtp, weight_bytes, host_bytes, host_dtype, kv_fp8
        )

    return with_shorter(got, at, c.context is not None or slots is not None or parallel is not None)
