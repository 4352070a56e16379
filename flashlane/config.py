"""EngineConfig: the engine options of DESIGN.md section 8, from flags, LLM kwargs and the
environment (flag or kwarg first, then the environment, then the default). Frozen. Each
field carries its flag's names, type, help and variables (`options.Flag`), so the command
line (`flags.engine_flags`) and the environment follow the fields."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from flashlane.options import (
    environment_values,
    flag_of,
    in_choices,
    json_object,
    option,
    our_names,
)

DEFAULT_MODEL = Path(__file__).parent / "default_model"
# The embedded model was trained on code, not on reasoning traces: a think block it opens
# never closes, so its chats start with the block closed (a request may still turn it on).
EMBEDDED_CHAT_KWARGS = {"enable_thinking": False}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The engine options: one field each, with its flag (`option`), or `internal` and why
    it has none."""

    model: str | None = option(  # None: the embedded default model
        None,
        "checkpoint folder or hub id org/name (default: the embedded model)",
        aliases=("-m",),
    )
    device: str = option(  # auto: cuda when present
        "auto", "auto, cpu or cuda[:N] (default: auto, cuda when torch sees a GPU)"
    )
    dtype: str = option(  # auto: bfloat16 on cuda, float32 on cpu
        "auto",
        "auto, bfloat16, float32 or float64 (default: "
        "auto, bfloat16 on cuda; the CPU always computes in float64, see README)",
    )
    # "fp8": a plain checkpoint's linears quantized to block FP8 at load (models/fp8.py), kept
    # FP8 on CUDA, dequantized to the compute dtype on the CPU (models/fp8_weights.py); None:
    # as the checkpoint stores them (a block-FP8 checkpoint is read the same way)
    quantization: str | None = option(
        None,
        "fp8: quantize a bf16/fp32 checkpoint's linears to block FP8 (128x128 "
        "e4m3 blocks) at load; on cuda they stay FP8 and run on the FP8 GEMMs, the "
        "CPU dequantizes them and computes the FP8 model's values in float64 "
        "(default: none, the weights as the checkpoint stores them; a block-FP8 "
        "checkpoint is read the same way: FP8 on cuda, dequantized on the CPU)",
        aliases=("-q",),
        choices=("fp8",),
    )
    # where the n-gram (PLE) tables live: "cuda" (the model's GPU), "cpu" (pinned host memory,
    # read by the GPU's kernel through mapped memory, or gathered on the host a round and
    # copied in), None: the GPU when the memory plan fits with them there, else the host
    # (always the host on the CPU)
    ple_table_device: str | None = option(
        None,
        "where a GPU model's n-gram (PLE) tables live: cuda, or cpu (pinned host "
        "memory, planned against 70%% of RAM; the GPU reads each round's rows through "
        "mapped memory) (default: auto, cuda when the memory plan fits them there, "
        "else cpu)",
        choices=("auto", "cpu", "cuda"),
    )
    # the n-gram tables' values: "bf16" (as the weights) or "int8" (models/table8.py; host
    # memory only); "auto": int8 only where the host's ceiling holds those and not bf16
    ple_table_dtype: str = option(
        "auto",
        "the n-gram (PLE) tables' values: bf16 (as the weights) or int8 (one fp32 scale "
        "per row, about half the bytes; host memory only: int8 puts the tables there and "
        "refuses --ple-table-device cuda) (default: auto, bf16 unless the tables in host "
        "memory are over its ceiling and int8 fits)",
        choices=("auto", "bf16", "int8"),
    )
    # the attention caches' values (K, V and indexer keys, the MTP layer's too): "auto" the
    # compute dtype; "fp8" e4m3 with an fp32 scale per row and head (kernels/attention/kv8.py)
    kv_cache_dtype: str = option(
        "auto",
        "the attention caches' values: auto (the compute dtype), bf16, or fp8 (e4m3 with "
        "an fp32 scale per position and head, about half of bf16's bytes; the CPU and the "
        "reference kernels dequantize, the Triton kernels need a GPU of compute capability "
        "8.9 or later) (default: auto)",
        choices=("auto", "bf16", "fp8"),
    )
    # sessions; auto: as many as fit, up to 16 (256 on a GPU); the flag's text is checked in
    # flags.engine_options
    parallel: int | str = option(
        "auto",
        "sessions, the replies decoded at once: auto or N (default: auto, as "
        "many as fit, up to 16 on the CPU and 256 on a GPU)",
        aliases=("--max-num-seqs", "-np"),
        metavar="N",
    )
    context: int | None = option(  # positions per session; None: the model's window
        None,
        "positions per session, prompt plus reply (default: the model's window;"
        " unlike llama.cpp's -c, every session gets it, it is not divided by -np)",
        aliases=("--max-model-len", "-c"),
        type=int,
        metavar="TOKENS",
    )
    slot_contexts: str | None = option(  # "65536,32768x3,16384x11"
        None,
        "sessions of different sizes, e.g. "
        '"65536,32768x3,16384x11" (default: FLASHNEXT_SLOT_CONTEXTS, else unset)',
        env=("FLASHNEXT_SLOT_CONTEXTS",),
    )
    # the grow margin of sized sessions; None: 8192 (slots.DEFAULT_GROW), never refused for
    # sessions smaller than it, as a margin the user did not ask for
    slot_grow: int | None = option(
        None,
        "tokens of room a stream must "
        "have to start a round (default: FLASHNEXT_SLOT_GROW, else 8192)",
        type=int,
        env=("FLASHNEXT_SLOT_GROW",),
    )
    memory_limit_gb: float | None = option(
        None,
        "GiB for weights, "
        "sessions and workspace (default: FLASHNEXT_LOAD_LIMIT_GB, else the GPU's memory "
        "less 10%% or 5 GiB, whichever is less, or 70%% of RAM)",
        type=float,
        env=("FLASHNEXT_LOAD_LIMIT_GB",),
    )
    # vLLM's --gpu-memory-utilization: the limit as a fraction of the device's memory (RAM on
    # the CPU); memory_limit_gb wins when both are given
    gpu_memory_utilization: float | None = option(
        None,
        "the memory limit as a fraction of the device's memory, vLLM's name "
        "(default: 0.9 or all but 5 GiB on a GPU, 0.7 of RAM; --memory-limit-gb wins)",
        type=float,
        metavar="FRACTION",
    )
    max_rows: int | None = option(  # decode rows per round; None: 64 cuda, 16 cpu
        None,
        "rows per round, the verify batch (default: 64 on cuda, 16 on the CPU)",
        type=int,
    )
    max_queue: int = option(256, "requests that may wait for a session (default: 256)", type=int)
    drafts: bool = option(True, "no MTP or copy drafts (default: drafts on)")
    mtp_drafts: int = option(3, "the longest MTP chain (default: 3)", type=int)
    mtp_confidence: float = option(
        0.7, "the MTP head's probability a chain step needs (default: 0.7)", type=float
    )
    prompt_cache_gb: float | None = option(  # GiB of kept prompt states; None: planned; 0: off
        None,
        "GiB of kept prompt "
        "states; 0: off (default: 1 on the CPU, 4 on a GPU, at most 1/8 of the limit)",
        type=float,
        env=("FLASHLANE_PROMPT_CACHE_GB",),
    )
    chat_template: str | None = option(  # a jinja file or the template text
        None,
        "a jinja chat template, a file or the template itself (default: the checkpoint's)",
        metavar="FILE_OR_TEXT",
    )
    # chat_template_kwargs a request's own override; None: {} for a checkpoint, and
    # {"enable_thinking": False} for the embedded model (EMBEDDED_CHAT_KWARGS)
    # (RUF009: option returns a dataclasses.field)
    default_chat_template_kwargs: dict[str, Any] | None = option(  # noqa: RUF009
        None,
        "chat_template_kwargs every chat starts from, e.g. "
        "'{\"enable_thinking\": true}' (default: {}; the embedded model: "
        '{"enable_thinking": false})',
        type=json_object,
        metavar="JSON",
    )
    unpriced: bool = option(
        False,
        "draft rows without the timed cost table (default: priced; FLASHLANE_UNPRICED=1)",
        env=("FLASHLANE_UNPRICED",),
    )
    lone: bool = option(
        True,
        "no lone driver for a single stream on cuda (default: lone driver on; FLASHLANE_NO_LONE=1)",
        env=("FLASHLANE_NO_LONE", "FLASHNEXT_NO_LONE"),
    )
    # up to this many live streams decode together on the lone driver (its step graphs, one
    # per batch size, take any sessions); None: every session (the driver runs on CUDA only)
    lone_streams: int | None = option(
        None,
        "live streams the lone driver may decode together on cuda (default: every session)",
        type=int,
        env=("FLASHLANE_LONE_STREAMS",),
    )
    # sampled streams on the lone driver's keyed draw (the shared rounds' tokens: tests/gpu/
    # test_lone_sampled_gpu.py); off, they decode in shared rounds
    lone_sampled: bool = option(
        True,
        "sampled streams (temperature, top_p, top_k) decode in shared rounds, off the lone "
        "driver (default: the lone driver takes them; FLASHLANE_NO_LONE_SAMPLED=1)",
        env=("FLASHLANE_NO_LONE_SAMPLED",),
    )
    # a lone step stores its verdict into the pinned ring itself where the GPU writes host
    # memory (runner/lone_buffers.posts_to_pinned); off, a copy follows each step
    lone_post: bool = option(
        True,
        "copy each lone step's tokens to the host after it, not stored by the step itself "
        "(default: stored by the step where the GPU can write host memory; "
        "FLASHLANE_NO_LONE_POST=1)",
        env=("FLASHLANE_NO_LONE_POST",),
    )
    # the eager rounds, the reference the graphed step must equal bit for bit; read once, when
    # the engine is built (engine.py)
    graphs: bool = option(
        True,
        "run rounds eagerly on cuda, without CUDA graphs or the lone driver's step graphs "
        "(default: graphs on; FLASHLANE_NO_GRAPHS=1)",
        env=("FLASHLANE_NO_GRAPHS",),
    )
    # the kernel set, chosen once at engine start (kernels.select_kernels)
    kernels: str = option(
        "auto",
        "auto: Triton's on cuda (the torch references on the CPU, or where Triton is "
        "missing); reference: the torch references on cuda too; walk / gather / listed: "
        "Triton's with decode windows through the split walk and one select program a row "
        "/ the gathered / the listed attention (default: auto; FLASHLANE_KERNELS=reference)",
        choices=("auto", "reference", "walk", "gather", "listed"),
        env=("FLASHLANE_KERNELS",),
    )
    # requests without a seed take seed, seed + 1, ... in submission order; None: fresh random
    seed: int | None = option(
        None,
        "requests without a seed take seed S, S+1, ... in arrival order, "
        "so a run is reproducible (default: a fresh random seed each)",
        type=int,
        metavar="S",
        serve_only=True,
        dest="engine_seed",
    )
    # processes (one per device) the model's heads and experts are split over (parallel/);
    # past 1, rank 0 spawns the others, or joins the group torchrun started
    tensor_parallel_size: int = option(
        1,
        "processes (one per device) the heads and experts are split over; rank 0 "
        "spawns the others, or joins the group torchrun started (default: 1)",
        aliases=("-tp",),
        type=int,
    )

    expert_parallel: bool = option(
        False,
        "with --tensor-parallel-size N: place whole experts on the ranks (E / N each) instead "
        "of splitting every expert's width; replies are the same bits as one rank's; the "
        "CPU's kernels only so far (default: off, experts split)",
    )

    @classmethod
    def resolve(cls, **options: Any) -> EngineConfig:
        """Options (kwargs) over the environment over defaults; unknown -> TypeError.
        vLLM's keyword names (max_model_len, max_num_seqs, enable_prefix_caching) are
        accepted for ours."""
        options = our_names(options)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(unknown)}")
        values = {k: v for k, v in options.items() if v is not None}
        return cls(**values, **environment_values(fields(cls), values, os.environ))

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, why: str) -> None:
            if not ok:
                raise ValueError(f"engine option {name}: {why}")

        need(
            self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:"),
            "device",
            f"must be auto, cpu or cuda[:N], got {self.device!r}",
        )
        need(
            self.dtype in ("auto", "float32", "bfloat16", "float64"),
            "dtype",
            f"must be auto, float32, bfloat16 or float64, got {self.dtype!r}",
        )
        need(
            self.parallel == "auto" or (isinstance(self.parallel, int) and self.parallel >= 1),
            "parallel",
            f"must be auto or an int >= 1, got {self.parallel!r}",
        )
        need(self.context is None or self.context >= 1, "context", "must be >= 1")
        frac = self.gpu_memory_utilization
        for f in fields(self):  # a flag's choices bind the keyword too
            need(*in_choices(f, getattr(self, f.name)))
        need(
            not (self.ple_table_dtype == "int8" and self.ple_table_device == "cuda"),
            "ple_table_dtype",
            "int8 tables live in host memory only: drop --ple-table-device cuda (int8 "
            "puts them there) or keep them bf16 on the GPU",
        )
        need(frac is None or 0 < frac <= 1, "gpu_memory_utilization", f"must be in (0, 1]: {frac}")
        need(self.max_rows is None or self.max_rows >= 1, "max_rows", "must be >= 1")
        need(self.max_queue >= 0, "max_queue", "must be >= 0")
        need(
            self.lone_streams is None or self.lone_streams >= 1,
            "lone_streams",
            f"must be >= 1, got {self.lone_streams}",
        )
        need(
            isinstance(self.tensor_parallel_size, int) and self.tensor_parallel_size >= 1,
            "tensor_parallel_size",
            f"must be an int >= 1, got {self.tensor_parallel_size!r}",
        )
        need(0 <= self.mtp_drafts <= 16, "mtp_drafts", "must be in 0..16")
        need(0.0 <= self.mtp_confidence <= 1.0, "mtp_confidence", "must be in [0, 1]")
        need(self.slot_grow is None or self.slot_grow >= 1, "slot_grow", "must be >= 1")
        kw = self.default_chat_template_kwargs
        need(kw is None or isinstance(kw, dict), "default_chat_template_kwargs", "must be a dict")
        need(
            self.prompt_cache_gb is None or self.prompt_cache_gb >= 0,
            "prompt_cache_gb",
            "must be >= 0 (0 disables the prompt cache)",
        )

    @property
    def chat_template_kwargs(self) -> dict[str, Any]:
        """The chat_template_kwargs every chat starts from (a request's own win)."""
        if self.default_chat_template_kwargs is not None:
            return dict(self.default_chat_template_kwargs)
        return dict(EMBEDDED_CHAT_KWARGS) if self.model is None else {}

    @property
    def model_path(self) -> Path:
        """The local folder `model` names (a hub id: see models.hub.resolve_model)."""
        return Path(self.model) if self.model else DEFAULT_MODEL

    def resolved_device(self) -> str:
        import torch

        if self.device == "auto":
            return "cuda" if torch.cuda.is_available() else "cpu"
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else "no GPU visible"
            raise ValueError(
                f"--device {self.device}: torch {torch.__version__} is {build}; use --device cpu"
                " (or auto), or install a CUDA build of torch"
            )
        return self.device


# kwarg -> the environment variables that may set it (from the fields' flags)
ENVIRONMENT = {
    f.name: flag_of(f).env for f in fields(EngineConfig) if flag_of(f) and flag_of(f).env
}
