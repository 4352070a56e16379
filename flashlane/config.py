"""EngineConfig: the engine options of DESIGN.md section 8, from flags, LLM kwargs and the
environment (flag or kwarg first, then the environment, then the default). Frozen."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_MODEL = Path(__file__).parent / "default_model"
# The embedded model was trained on code, not on reasoning traces: a think block it opens
# never closes, so its chats start with the block closed (a request may still turn it on).
EMBEDDED_CHAT_KWARGS = {"enable_thinking": False}

# kwarg -> environment variables that may set it
ENVIRONMENT = {
    "slot_contexts": ("FLASHNEXT_SLOT_CONTEXTS",),
    "slot_grow": ("FLASHNEXT_SLOT_GROW",),
    "memory_limit_gb": ("FLASHNEXT_LOAD_LIMIT_GB",),
    "prompt_cache_gb": ("FLASHLANE_PROMPT_CACHE_GB",),
    "unpriced": ("FLASHLANE_UNPRICED",),
    "lone": ("FLASHLANE_NO_LONE", "FLASHNEXT_NO_LONE"),
    "lone_streams": ("FLASHLANE_LONE_STREAMS",),
}
TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str | None = None  # None: the embedded default model
    device: str = "auto"  # auto: cuda when present
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu
    parallel: int | str = "auto"  # sessions; auto: as many as fit, up to 16 (256 on a GPU)
    context: int | None = None  # positions per session; None: the model's window
    slot_contexts: str | None = None  # "65536,32768x3,16384x11"
    # the grow margin of sized sessions; None: 8192 (slots.DEFAULT_GROW), never refused for
    # sessions smaller than it, as a margin the user did not ask for
    slot_grow: int | None = None
    memory_limit_gb: float | None = None
    # vLLM's --gpu-memory-utilization: the limit as a fraction of the device's memory (RAM on
    # the CPU); memory_limit_gb wins when both are given
    gpu_memory_utilization: float | None = None
    max_rows: int | None = None  # decode rows per round; None: 64 cuda, 16 cpu
    max_queue: int = 256
    drafts: bool = True
    mtp_drafts: int = 3
    mtp_confidence: float = 0.7
    prompt_cache_gb: float | None = None  # GiB of kept prompt states; None: planned; 0: off
    unpriced: bool = False
    lone: bool = True
    # up to this many live streams decode together on the lone driver (its step graphs, one
    # per batch size, take any sessions); None: every session (the driver runs on CUDA only)
    lone_streams: int | None = None
    chat_template: str | None = None  # a jinja file or the template text; None: the checkpoint's
    # chat_template_kwargs a request's own override; None: {} for a checkpoint, and
    # {"enable_thinking": False} for the embedded model (EMBEDDED_CHAT_KWARGS)
    default_chat_template_kwargs: dict[str, Any] | None = None
    # "fp8": a plain checkpoint's linears quantized to block FP8 at load, then dequantized to
    # the compute dtype (models/fp8.py; the GPU FP8 GEMMs are issue 34's, not built yet); None:
    # as the checkpoint stores them (a block-FP8 checkpoint is dequantized either way)
    quantization: str | None = None
    # requests without a seed take seed, seed + 1, ... in submission order; None: fresh random
    seed: int | None = None
    # processes (one per device) the model's heads and experts are split over (parallel/);
    # past 1, rank 0 spawns the others, or joins the group torchrun started
    tensor_parallel_size: int = 1

    @classmethod
    def resolve(cls, **options: Any) -> EngineConfig:
        """Options (kwargs) over the environment over defaults; unknown -> TypeError.
        vLLM's keyword names (max_model_len, max_num_seqs, enable_prefix_caching) are
        accepted for ours."""
        options = _ours(options)
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise TypeError(f"unknown engine option(s): {', '.join(unknown)}")
        values = {k: v for k, v in options.items() if v is not None}
        for name, variables in ENVIRONMENT.items():
            if name in values:
                continue
            for var in variables:
                raw = os.environ.get(var)
                if raw is None or raw == "":
                    continue
                values[name] = _from_env(name, var, raw)
                break
        return cls(**values)

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
        need(
            self.quantization in (None, "fp8"),
            "quantization",
            f"must be fp8 or unset, got {self.quantization!r}",
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


# vLLM's LLM(...) keyword -> ours
VLLM_NAMES = {"max_model_len": "context", "max_num_seqs": "parallel"}


def _ours(options: dict[str, Any]) -> dict[str, Any]:
    out = dict(options)
    for theirs, name in VLLM_NAMES.items():
        if theirs not in out:
            continue
        value = out.pop(theirs)
        if out.get(name) is not None and value is not None and out[name] != value:
            raise TypeError(f"{theirs}={value!r} and {name}={out[name]!r} disagree: give one")
        if value is not None:
            out[name] = value
    if "enable_prefix_caching" in out:
        on = out.pop("enable_prefix_caching")
        if on is False:
            if out.get("prompt_cache_gb") not in (None, 0):
                raise TypeError("enable_prefix_caching=False and prompt_cache_gb disagree")
            out["prompt_cache_gb"] = 0.0
    return out


def _from_env(name: str, var: str, raw: str) -> Any:
    if name == "lone":  # the variables say NO_LONE
        return raw.strip().lower() not in TRUE
    if name == "unpriced":
        return raw.strip().lower() in TRUE
    try:
        if name in ("slot_grow", "lone_streams"):
            return int(raw)
        if name in ("memory_limit_gb", "prompt_cache_gb"):
            return float(raw)
    except ValueError:
        raise ValueError(f"{var}={raw!r} is not a number") from None
    return raw
