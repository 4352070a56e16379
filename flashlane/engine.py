"""Engine: the model, its sessions, the backend and the lane host, wired once at start.

`LLM` (synchronous) and `AsyncEngine` (the server's) both drive one Engine.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import sys
from collections import Counter
from pathlib import Path

import torch

from flashlane import engine_plan
from flashlane.config import EngineConfig
from flashlane.kernels import select_kernels
from flashlane.lanes.host import HostConfig, LaneHost
from flashlane.lanes.records import CostTable
from flashlane.lanes.stops import StopRules
from flashlane.models import folder
from flashlane.models.config import ModelConfig
from flashlane.models.flashnext import FlashNext
from flashlane.models.fp8_weights import fp8_weights
from flashlane.models.host_tables import device_bytes, host_bytes, table_dtype_of
from flashlane.models.hub import resolve_model
from flashlane.models.loader import load_checkpoint
from flashlane.models.segments import expandable_segments
from flashlane.models.state import SessionState
from flashlane.parallel.group import TensorParallel
from flashlane.parallel.launch import start as start_group
from flashlane.parallel.plan import shard_config, shard_model
from flashlane.parallel.replay import ReplayedBackend
from flashlane.planning import memory
from flashlane.planning.shorter import shorter_note
from flashlane.request import SeedSource
from flashlane.runner.backend import ModelBackend
from flashlane.runner.costs import describe, time_costs
from flashlane.sampling.grammar import Grammars


def compute_dtypes(device: str, dtype: str) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """(weights and activations, attention caches, GDN state).

    On the CPU everything computes in float64 and logits are rounded to float32: torch's CPU
    GEMMs are not row-invariant in fp32, and a differing fp64 bit almost never survives the
    rounding, so a row's logits do not depend on the batch (DESIGN.md section 1).
    """
    if device == "cpu":
        return torch.float64, torch.float64, torch.float64
    weights = {
        "auto": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "float32": torch.float32,
        "float64": torch.float64,
    }[dtype]
    return weights, weights, torch.float32


class Engine:
    def __init__(
        self,
        config: EngineConfig,
        costs: CostTable | None = None,
        log=None,
        built: tuple[ModelConfig, FlashNext] | None = None,
        tokenizer_from: Path | None = None,
        tp: TensorParallel | None = None,
    ):
        """`built` serves a model made elsewhere (a random checkpoint on the GPU) instead of
        loading config.model_path; it has no tokenizer, so requests pass token ids, unless
        `tokenizer_from` names a model folder whose tokenizer and chat template it takes
        (ids past that tokenizer's words decode to no text). `tp`: this rank's group under
        tensor parallel (parallel/launch.py); a rank past 0 builds no host (its backend
        replays rank 0's calls); None with config.tensor_parallel_size > 1: start the group."""
        self.config = config
        self.log = log or _default_log()
        self.device = config.resolved_device()
        if config.expert_parallel and self.device.startswith("cuda"):
            raise ValueError(
                "--expert-parallel runs on the CPU's kernels only so far; on GPUs tensor "
                "parallel splits every expert's width (drop --expert-parallel)"
            )
        if tp is None and config.tensor_parallel_size > 1:
            # a size the model cannot be split by fails here, before any process starts
            cfg = built[0] if built else ModelConfig.from_hf(resolve_model(config.model)[0])
            shard_config(cfg, config.tensor_parallel_size, config.expert_parallel)
            tp = start_group(config, self.device, type(self))
        self.tp = tp
        self.device = tp.device if tp is not None else self.device
        if self.device == "cpu" and config.dtype not in ("auto", "float64"):
            logger.warning(
                "--dtype %s: the CPU computes in float64 whatever the dtype (its "
                "GEMMs are row-invariant only so; README, Exactness on the CPU)",
                config.dtype,
            )
        if self.device == "cpu":
            # Small CPU forwards are bound by Python, not arithmetic, and a second OpenMP
            # thread that waits for a busy core stalls every op (seen: 60 ms -> 2 s a round).
            torch.set_num_threads(1)
        weights, cache, state = compute_dtypes(self.device, config.dtype)
        engine_plan.kv_fp8_for(config, cache)  # a bf16 cache on the CPU refused before the load
        self.max_rows = config.max_rows or (64 if self.device.startswith("cuda") else 16)
        if built is None:
            path, self.name = resolve_model(config.model)
            raw_cfg = ModelConfig.from_hf(path)
            place = engine_plan.table_place_for(config, raw_cfg, path, self.device, self.max_rows)
            table_dtype = engine_plan.table_dtype_for(
                config.ple_table_dtype, raw_cfg, place, weights.itemsize
            )
            with expandable_segments(self.device):  # models/segments.py
                self.model_config, self.model = load_checkpoint(
                    path,
                    weights,
                    self.device,
                    quantize=config.quantization,
                    ple_tables=place,
                    table_dtype=table_dtype,
                )
            self.tokenizer = folder.tokenizer(path)
            self.generation_defaults = folder.generation_defaults(path)
            self.chat_template = folder.chat_template(path)
        else:
            self.model_config, self.model = built
            self.tokenizer, self.generation_defaults, self.chat_template = None, {}, None
            if tokenizer_from is not None:
                self.tokenizer = folder.tokenizer(tokenizer_from)
                self.chat_template = folder.chat_template(tokenizer_from)
            self.name = "a model built in memory"
        if config.chat_template is not None:
            self.chat_template = folder.read_template(config.chat_template)
        cfg = self.model_config
        # a rank's layers and sessions: its heads and expert widths (parallel/plan.py)
        rank_cfg = shard_config(cfg, tp.size if tp else 1, config.expert_parallel)
        if tp is not None:
            shard_model(self.model, tp, config.expert_parallel)
        self.seeds = SeedSource(config.seed)
        reference = config.kernels == "reference"
        decode = "auto" if reference else config.kernels
        self.kernels = select_kernels(self.device, self.log, reference, decode)
        kv_fp8 = engine_plan.kv_fp8_for(config, cache, self.model, self.device, self.kernels.name)
        with expandable_segments(self.device):  # stacks the experts: a copy each
            self.model.use_kernels(self.kernels)
        # blocks replay their row-count-only parts and one stream steps alone (runner/lone.py),
        # neither under tensor parallel yet (collectives run eagerly, issue 36)
        self.graphed = tp is None
        self.plan = engine_plan.plan_for(
            config,
            rank_cfg,
            self.device,
            self.max_rows,
            self.model.mtp is not None,
            device_bytes(self.model),
            host_bytes(self.model),
            table_dtype_of(self.model),
            kv_fp8,
        )
        if tp is not None:  # every rank holds the sessions rank 0 planned
            self.plan = tp.broadcast(self.plan)
        self.max_rows = self.plan.max_rows  # fewer where the sessions fill fewer
        if self.kernels.name == "triton" and config.graphs and self.graphed:
            self._capture_graphs()
        self.sessions = [
            SessionState.empty(rank_cfg, c, cache, state, self.device, kv_fp8)
            for c in self.plan.capacities
        ]
        # The host's pieces and the backend's limit are one number (memory.PREFILL_ROWS: a GPU
        # piece reads every expert's weights once a layer, which bounded the MoE at 2,048 rows;
        # 8,192 is SGLang's chunked-prefill default on large GPUs); the plan holds its activations.
        prefill_rows = self.plan.prompt_rows
        rules = self._stop_rules()
        self.backend = ModelBackend(
            self.model,
            self.sessions,
            self.max_rows,
            mtp_confidence=config.mtp_confidence,
            max_prompt_rows=prefill_rows,
            grammars=self._grammars(rules),
        )
        timed = costs is None and not config.unpriced
        if tp is not None:  # the timed forwards' collectives run on every rank
            timed = tp.broadcast(timed)
        if timed:
            scratch = [
                SessionState.empty(rank_cfg, 64 + self.max_rows, cache, state, self.device, kv_fp8)
                for _ in range(min(self.max_rows, len(self.sessions)))
            ]
            costs = time_costs(self.model, scratch, self.max_rows)
            del scratch  # freed before fit_prompt_pieces measures the start
        if costs is not None:
            self.backend.set_costs(costs)
        if tp is not None and not tp.is_leader:
            self.host = None
            return
        if tp is not None:
            self.backend = ReplayedBackend(self.backend, tp)
            atexit.register(self.backend.close)
        lanes = dataclasses.replace(
            engine_plan.lane_drafts(config, self.model.mtp is not None),
            max_rows=self.max_rows,
            max_streams=len(self.sessions),
            unpriced=config.unpriced,
        )
        self.host = LaneHost(
            self.backend,
            HostConfig(
                lanes=lanes,
                max_queue=config.max_queue,
                prefill_rows=prefill_rows,
                prompt_cache_bytes=self.plan.prompt_cache_bytes,
                lone_streams=config.lone_streams or len(self.sessions),
            ),
            rules,
            self.plan.capacities,
            grow=config.slot_grow if config.slot_contexts is not None else None,
            lone=self._lone_driver(),
        )
        if self.device.startswith("cuda") and self.graphed:
            torch.cuda.empty_cache()  # what stays reserved: tensors and the graphs' pools
            self.fit_prompt_pieces(rank_cfg, torch.cuda.memory_reserved(self.device))
        self.log(self.summary(weights, costs))

    def summary(self, weights: torch.dtype, costs: CostTable | None) -> str:
        """The start-up summary: what runs where, with which sessions, drafts and costs."""
        p, c = self.plan, self.config
        counts = Counter(p.capacities)
        sessions = ", ".join(f"{n} x {cap}" for cap, n in sorted(counts.items(), reverse=True))
        cpu = " (the CPU's row-invariant path, whatever --dtype)" if self.device == "cpu" else ""
        mtp = f"MTP up to {c.mtp_drafts} + copy" if self.model.mtp else "copy only (no MTP head)"
        gib = memory.GIB
        fp8 = fp8_weights(self.model)
        fp8_gib = sum(w.q.nbytes + w.scale_inv.nbytes for w in fp8.values()) / gib
        kept = f", {len(fp8)} block-FP8 weights ({fp8_gib:.2f} GiB)" if fp8 else ""
        lines = [
            f"loaded {self.name} on {self.device}",
            f"  compute   {str(weights).removeprefix('torch.')}{cpu}, {self.kernels.name} "
            f"kernels{kept}",
            f"  sessions  {sessions} positions{', fp8 KV' if self.sessions[0].kv_fp8 else ''}; "
            f"{self.max_rows} rows a round, queue {c.max_queue}",
            *([f"  note      {shorter_note(p)}"] if p.shorter else []),
            f"  drafts    {mtp if c.drafts else 'off'}",
            f"  memory    {p.weight_bytes / gib:.2f} GiB weights, {sum(p.session_bytes) / gib:.2f}"
            f" GiB sessions, {p.prompt_cache_bytes / gib:.2f} GiB prompt cache; limit "
            f"{p.limit_bytes / gib:.1f} GiB"
            + (
                f"; n-gram tables {p.host_bytes / gib:.2f} GiB in host memory ({p.host_dtype})"
                if p.host_bytes
                else ""
            ),
            f"  costs     {describe(costs).removeprefix('costs ') if costs else 'unpriced'}",
        ]
        if self.tp is not None:
            lines.append(
                f"  parallel  tensor parallel over {self.tp.size} ranks (weights per rank)"
            )
        return "\n".join(lines)

    def _lone_driver(self):
        """The lone driver on CUDA (graphed unless `graphs` is off), unless `lone` is
        off; on the CPU a lone step costs what a shared round does, so shared rounds serve.
        A sibling's sessions with an 8-bit KV cache decode in shared rounds."""
        on = self.config.lone and self.device.startswith("cuda") and self.graphed
        kv8 = self.sessions[0].kv_fp8 and self.model_config.family != "flashnext"
        if not on or kv8:
            return None
        from flashlane.runner.lone import LoneDriver

        driver = LoneDriver(
            self.model,
            self.sessions,
            graphs=self.model.graphs is not None,
            drafter=self.backend.drafter,
            sampled=self.config.lone_sampled,
            post=self.config.lone_post,
            max_rows=self.max_rows,
        )
        n, s = driver.capture_all(), f"{driver.capture_seconds:.1f} s"
        failed = f" (failed, steps run eagerly: {driver.failed})" if driver.failed else ""
        self.log(f"flashlane: lone driver, {n} step graphs captured in {s}{failed}")
        driver.log = self.log  # a capture that fails later says so too
        return driver

    def fit_prompt_pieces(self, cfg: ModelConfig, started: int) -> None:
        """Prompt pieces that fit beside the `started` bytes measured (graph pools included)."""
        rows, planned = memory.prompt_rows_that_fit(self.plan, cfg, started), self.plan.prompt_rows
        if rows < planned:
            self.log(f"flashlane: prompt pieces of {rows} rows, not {planned}: graph pools")
            self.plan = dataclasses.replace(self.plan, prompt_rows=rows)
            self.backend.max_prompt_rows = rows
            self.host.config = dataclasses.replace(self.host.config, prefill_rows=rows)

    def _capture_graphs(self) -> None:
        """CUDA graphs of every layer's row-count-only parts, for rounds of up to max_rows
        (at most 64) rows: all captured now, so no round pays a capture."""
        from flashlane.runner.graphs import Graphs, capture_all

        graphs = self.model.graphs = Graphs(max_rows=min(self.max_rows, 64), log=self.log)
        secs, used = capture_all(self.model, graphs)
        failed = f" (failed: {graphs.failed})" if graphs.failed else ""
        self.log(
            f"flashlane: {len(graphs.entries)} CUDA graphs captured in {secs:.1f} s, "
            f"{used / 2**20:.0f} MiB{failed}"
        )

    def _grammars(self, rules: StopRules) -> Grammars | None:
        """Constrained decoding's view of the tokenizer (none without one); a finished grammar
        allows only the ids that end a reply."""
        if self.tokenizer is None:
            return None
        vocab = self.model_config.vocab_size
        return Grammars(self.tokenizer.to_str(), vocab, sorted(rules.eos_ids))

    def _stop_rules(self) -> StopRules:
        tok, cfg = self.tokenizer, self.model_config
        eos = set(cfg.eos_token_ids)
        gen_eos = self.generation_defaults.get("eos_token_id")
        eos |= set(
            gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
        )
        close, end = (), None
        if tok is not None and tok.token_to_id("</think>") is not None:
            end = tok.token_to_id("</think>")
            close = tuple(tok.encode("\n</think>\n\n", add_special_tokens=False).ids)
        detok = (lambda ids: tok.decode(ids, skip_special_tokens=True)) if tok else None
        return StopRules(
            eos_ids=frozenset(eos), think_close_ids=close, think_end_id=end, detokenize=detok
        )

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"{self.name} has no tokenizer.json: pass token ids")
        return self.tokenizer.encode(text, add_special_tokens=False).ids


logger = logging.getLogger("flashlane")


def _default_log():
    """Engine messages go to the "flashlane" logger; when nothing configured logging (a
    script, `python -c`), it gets a stderr handler so they show, as vLLM's do."""
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    return logger.info
