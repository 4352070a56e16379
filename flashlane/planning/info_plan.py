"""The memory plan `flashlane info` shows: the engine's plan (engine_plan.py) from the info
command's flags alone, with no GPU and no checkpoint read (the config's parameter counts)."""

from __future__ import annotations

import argparse

from flashlane.lanes.core import LaneConfig
from flashlane.models.census import count_params
from flashlane.models.config import ModelConfig
from flashlane.models.host_tables import table_place
from flashlane.models.table8 import choose_table_dtype, int8_table_bytes
from flashlane.planning import memory
from flashlane.planning.shorter import with_shorter
from flashlane.sessions.slots import parse_slot_contexts

__all__ = ["H200_BYTES", "info_plan"]

# the GPU `info` plans for: an H200 as torch counts it (139.80 GiB, its out-of-memory report)
H200_BYTES = int(139.8 * 2**30)


def info_plan(cfg: ModelConfig, args: argparse.Namespace, env, quant=None) -> memory.MemoryPlan:
    """_plan(), with the shorter contexts that would serve more than one reply at once where
    it serves one (planning/shorter.py)."""
    sized = args.context or args.slot_contexts or args.parallel not in (None, "auto")

    def at(context: int) -> memory.MemoryPlan:
        return _plan(cfg, argparse.Namespace(**{**vars(args), "context": context}), env, quant)

    return with_shorter(_plan(cfg, args, env, quant), at, bool(sized))


def _plan(cfg: ModelConfig, args: argparse.Namespace, env, quant=None) -> memory.MemoryPlan:
    """The plan the engine would make: the same ceiling (flag, then FLASHNEXT_LOAD_LIMIT_GB),
    the same prompt cache budget beside the sessions, the weights in FP8 on cuda for a
    block-FP8 checkpoint (or --quantization fp8), and the n-gram tables where
    --ple-table-device puts them (auto: on cuda when the plan fits, else in host memory),
    in host memory as --ple-table-dtype keeps them (int8: there only), the attention caches
    as --kv-cache-dtype stores them (auto: memory.kv_fp8_planned, on an H200)."""
    device, slots = args.device or "cuda", args.slot_contexts
    limit = memory.resolve_limit_bytes(args.memory_limit_gb, env, device, H200_BYTES)
    cache_gb = args.prompt_cache_gb
    if cache_gb is None and env.get("FLASHLANE_PROMPT_CACHE_GB"):
        cache_gb = float(env["FLASHLANE_PROMPT_CACHE_GB"])
    elem = 2 if device == "cuda" else 8
    values = count_params(cfg).ngram_table
    table, width = elem * values, cfg.ple_embed_dim // max(cfg.num_ngram_heads, 1)
    if quant is not None and device == "cuda":
        from flashlane.models.weight_bytes import fp8_bytes

        weights = fp8_bytes(cfg, quant).total_bytes  # the table among the bf16 values
    else:
        weights = memory.weight_bytes(cfg, elem)
    tp = args.tensor_parallel_size
    if tp > 1:  # one rank's weights (bf16; the table whole, replicated) and heads
        from flashlane.parallel.footprint import rank_params
        from flashlane.parallel.plan import shard_config

        weights = rank_params(cfg, tp, placed=args.expert_parallel) * elem
        cfg = shard_config(cfg, tp, args.expert_parallel)
    ram = int(memory.RAM_FRACTION * memory.read_ram_bytes())
    opts = dict(
        device=device,
        limit_bytes=limit,
        max_rows=args.max_rows or (64 if device == "cuda" else 16),
        # rows no more than the sessions fill unless --max-rows is given (drafts on)
        window_rows=0 if args.max_rows else LaneConfig().widest_window,
        context=args.context,
        slot_contexts=None if slots is None else parse_slot_contexts(slots),
        parallel=None if args.parallel in (None, "auto") else int(args.parallel),
        prompt_rows=memory.PREFILL_ROWS[device],
        prompt_cache_bytes=memory.resolve_prompt_cache_bytes(cache_gb, device, limit),
        kv_fp8=memory.kv_fp8_planned(getattr(args, "kv_cache_dtype", None), bool(quant), device),
        prompt_cache_auto=cache_gb is None,
    )
    asked = args.ple_table_dtype or "auto"
    if asked == "int8" and args.ple_table_device == "cuda":
        raise ValueError("--ple-table-dtype int8: the 8-bit tables live in host memory only")

    def on_host() -> memory.MemoryPlan:
        kept = choose_table_dtype(asked, True, values, width, elem, ram)
        held = int8_table_bytes(values, width) if kept == "int8" else table
        return memory.plan_fitting(
            cfg, **opts, weight_bytes=weights - table, host_bytes=held, host_limit_bytes=ram,
            host_dtype=kept,
        )  # fmt: skip

    requested = "cpu" if asked == "int8" else args.ple_table_device
    if not table:
        return memory.plan_fitting(cfg, **opts, weight_bytes=weights)
    if table_place(requested, device, True) == "host":
        return on_host()
    try:
        return memory.plan_fitting(cfg, **opts, weight_bytes=weights)
    except memory.OverMemoryLimit:
        if table_place(requested, device, False) == "device":
            raise
        return on_host()
