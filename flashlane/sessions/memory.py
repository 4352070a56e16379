"""The memory plan: the ceiling, what the weights, workspace and sessions take, `--parallel auto`.

No torch: byte counts from the ModelConfig. `session_buffers` lists every buffer the runner
allocates for one session (its allocation test compares them with real tensors); the workspace
is the verify scratch shared by all sessions plus a stated activation allowance. All sizes are
GiB (2**30 bytes), whatever a flag says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from flashlane.models.census import count_params
from flashlane.models.config import ModelConfig
from flashlane.sessions.slots import format_slot_contexts

GIB = 2**30
MIB = 2**20
LIMIT_ENV = "FLASHNEXT_LOAD_LIMIT_GB"
MAX_AUTO_SESSIONS = 16
GPU_FRACTION = 0.9  # default ceiling: of the GPU's total memory
RAM_FRACTION = 0.7  # of RAM, for a CPU model and for host memory holding a GPU model's table
# Element sizes of session buffers: (KV / conv cache, recurrent state) per device.
ELEMENT_BYTES = {"cuda": (2, 4), "cpu": (8, 8)}  # bf16 / fp32 on the GPU, fp64 on the CPU
# Activations beside the fp32 logits of a round (hidden states, MoE buffers, graph pools).
ACTIVATION_FIXED = {"cuda": GIB, "cpu": 64 * MIB}
# The prompt cache's default budget per device, at most PROMPT_CACHE_SHARE of the limit.
PROMPT_CACHE_GB = {"cuda": 4.0, "cpu": 1.0}
PROMPT_CACHE_SHARE = 0.125
REMEDIES = (
    "a smaller --context, fewer sessions (--parallel), smaller --slot-contexts, "
    f"or a higher --memory-limit-gb ({LIMIT_ENV})"
)


class OverMemoryLimit(Exception):
    """A plan over the ceiling; the message says what needed how much, and the remedies."""

    def __init__(self, what: str, need_bytes: int, limit_bytes: int):
        self.need_bytes, self.limit_bytes = need_bytes, limit_bytes
        super().__init__(
            f"{what} needs {need_bytes / GIB:.2f} GiB, over the {limit_bytes / GIB:.2f} GiB "
            f"available under the memory limit; remedies: {REMEDIES}"
        )


class OptionConflict(ValueError):
    """Two options that cannot hold together; the message names both."""


@dataclass(frozen=True, slots=True)
class Buffer:
    name: str  # "<part>.<field>" as in models/state.py: "attn.k", "mtp.v", "gdn.recurrent", ...
    shape: tuple[int, ...]
    itemsize: int  # bytes per element
    count: int  # how many layers hold one

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize * self.count


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    device: str  # "cuda" | "cpu"
    limit_bytes: int  # the ceiling for weights + workspace + sessions on that device
    weight_bytes: int  # weights resident on the device
    scratch_bytes: int  # shared verify scratch: a GDN state and conv row per window row
    activation_bytes: int  # max_rows x vocab fp32 logits + ACTIVATION_FIXED[device]
    capacities: tuple[int, ...]  # tokens of context, one per session
    session_bytes: tuple[int, ...]  # bytes of each session's buffers
    max_rows: int
    cache_bytes: int  # bytes per KV / conv element
    state_bytes: int  # bytes per recurrent-state element
    auto: bool  # --parallel auto chose the number of sessions
    serial: bool  # fewer than two sessions fit: one reply at a time
    host_bytes: int = 0  # host memory for a GPU model's n-gram table
    host_limit_bytes: int | None = None  # its ceiling (70% of RAM)
    prompt_cache_bytes: int = 0  # the prompt cache's budget (kept states), under the limit

    @property
    def workspace_bytes(self) -> int:
        return self.scratch_bytes + self.activation_bytes

    @property
    def budget_bytes(self) -> int:
        """What the sessions may take: limit - weights - workspace - prompt cache."""
        return self.limit_bytes - self.weight_bytes - self.workspace_bytes - self.prompt_cache_bytes

    @property
    def sessions_bytes(self) -> int:
        return sum(self.session_bytes)

    @property
    def free_bytes(self) -> int:
        return self.budget_bytes - self.sessions_bytes

    @property
    def num_sessions(self) -> int:
        return len(self.capacities)


def element_bytes(device: str) -> tuple[int, int]:
    """(cache_bytes, state_bytes) for a device: (2, 4) on cuda, (8, 8) on the CPU."""
    if device not in ELEMENT_BYTES:
        raise ValueError(f"device must be one of {sorted(ELEMENT_BYTES)}, got {device!r}")
    return ELEMENT_BYTES[device]


def session_buffers(
    cfg: ModelConfig, capacity: int, cache_bytes: int, state_bytes: int, mtp: bool = True
) -> tuple[Buffer, ...]:
    """Every buffer of one session of `capacity` positions (drafts off: mtp=False)."""
    kv = (capacity, cfg.num_kv_heads, cfg.head_dim)
    keys = (capacity, cfg.indexer_head_dim)
    blocks = (capacity // cfg.indexer_block, cfg.indexer_head_dim)
    out = []
    for prefix, count in (
        ("attn", cfg.layer_types.count("sparse")),
        ("mtp", cfg.num_mtp_layers if mtp else 0),
    ):
        out += [
            Buffer(f"{prefix}.k", kv, cache_bytes, count),
            Buffer(f"{prefix}.v", kv, cache_bytes, count),
            Buffer(f"{prefix}.index_keys", keys, cache_bytes, count),
            Buffer(f"{prefix}.block_keys", blocks, cache_bytes, count),
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
    cfg: ModelConfig, capacity: int, cache_bytes: int, state_bytes: int, mtp: bool = True
) -> int:
    return sum(b.nbytes for b in session_buffers(cfg, capacity, cache_bytes, state_bytes, mtp))


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


def activation_bytes(cfg: ModelConfig, max_rows: int, device: str) -> int:
    """The stated allowance: a round's fp32 logits plus ACTIVATION_FIXED[device]."""
    return max_rows * cfg.vocab_size * 4 + ACTIVATION_FIXED[device]


def weight_bytes(cfg: ModelConfig, param_bytes: int, table: bool = True, mtp: bool = True) -> int:
    """Bytes of the weights flashlane loads onto one device: text, the n-gram table when it
    lives there (a GPU model may keep it in host memory), the MTP head when drafting."""
    counts = count_params(cfg)
    params = counts.text + (counts.ngram_table if table else 0) + (counts.mtp if mtp else 0)
    return params * param_bytes


def parse_limit_gb(text: str | float) -> float:
    """`--memory-limit-gb` / FLASHNEXT_LOAD_LIMIT_GB: a positive number of GiB."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"--memory-limit-gb must be a number of GiB, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"--memory-limit-gb must be a positive number of GiB, got {text!r}")
    return value


def read_ram_bytes(meminfo: str | Path = "/proc/meminfo") -> int:
    """MemTotal from /proc/meminfo, in bytes."""
    for line in Path(meminfo).read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"{meminfo}: no MemTotal line")


def resolve_limit_bytes(
    flag: str | float | None,
    env: Mapping[str, str],
    device: str,
    gpu_total_bytes: int | None = None,
    ram_total_bytes: int | None = None,
) -> int:
    """The ceiling: the flag, else FLASHNEXT_LOAD_LIMIT_GB, else 90% of the GPU's memory
    (cuda) or 70% of RAM (cpu)."""
    given = flag if flag is not None else (env.get(LIMIT_ENV) or None)
    if given is not None:
        return int(parse_limit_gb(given) * GIB)
    if device == "cuda":
        if gpu_total_bytes is None:
            raise ValueError("the GPU's total memory is needed for the default memory limit")
        return int(gpu_total_bytes * GPU_FRACTION)
    ram = read_ram_bytes() if ram_total_bytes is None else ram_total_bytes
    return int(ram * RAM_FRACTION)


def resolve_prompt_cache_bytes(gb: float | None, device: str, limit_bytes: int) -> int:
    """--prompt-cache-gb, or the device's default (PROMPT_CACHE_GB, at most PROMPT_CACHE_SHARE
    of the limit); 0 disables the cache."""
    if gb is None:
        return min(int(PROMPT_CACHE_GB[device] * GIB), int(limit_bytes * PROMPT_CACHE_SHARE))
    if gb < 0:
        raise ValueError(f"--prompt-cache-gb must be 0 or more, got {gb}")
    return int(gb * GIB)


def plan(
    cfg: ModelConfig,
    *,
    device: str,
    limit_bytes: int,
    weight_bytes: int,
    max_rows: int,
    context: int | None = None,
    slot_contexts: Sequence[int] | None = None,
    parallel: int | None = None,
    mtp: bool = True,
    host_bytes: int = 0,
    host_limit_bytes: int | None = None,
    prompt_cache_bytes: int = 0,
) -> MemoryPlan:
    """Sessions under the ceiling: `slot_contexts` as listed, else `parallel` sessions of
    `context` (default: the model's window), else (`parallel=None`, auto) as many as fit up to
    16, one session when fewer than two fit; the prompt cache's budget is planned beside the
    weights and workspace. Raises OverMemoryLimit."""
    cache_b, state_b = element_bytes(device)
    scratch = sum(b.nbytes for b in scratch_buffers(cfg, max_rows, cache_b, state_b))
    fixed = weight_bytes + scratch + activation_bytes(cfg, max_rows, device) + prompt_cache_bytes
    if fixed > limit_bytes:
        what = "the weights, the round's workspace and the prompt cache"
        raise OverMemoryLimit(what, fixed, limit_bytes)
    if host_limit_bytes is not None and host_bytes > host_limit_bytes:
        raise OverMemoryLimit("the n-gram table in host memory", host_bytes, host_limit_bytes)
    budget = limit_bytes - fixed
    context = cfg.max_position_embeddings if context is None else context
    one = session_bytes(cfg, context, cache_b, state_b, mtp)
    capacities = _capacities(context, slot_contexts, parallel, budget // one)
    sizes = {c: session_bytes(cfg, c, cache_b, state_b, mtp) for c in set(capacities)}
    per_session = tuple(sizes[c] for c in capacities)
    if sum(per_session) > budget:
        what = f"{len(capacities)} session(s) of {format_slot_contexts(capacities)} tokens"
        raise OverMemoryLimit(what, sum(per_session), budget)
    return MemoryPlan(
        device=device,
        limit_bytes=limit_bytes,
        weight_bytes=weight_bytes,
        scratch_bytes=scratch,
        activation_bytes=activation_bytes(cfg, max_rows, device),
        capacities=capacities,
        session_bytes=per_session,
        max_rows=max_rows,
        cache_bytes=cache_b,
        state_bytes=state_b,
        auto=slot_contexts is None and parallel is None,
        serial=len(capacities) < 2,
        host_bytes=host_bytes,
        host_limit_bytes=host_limit_bytes,
        prompt_cache_bytes=prompt_cache_bytes,
    )


def _capacities(
    context: int, slot_contexts: Sequence[int] | None, parallel: int | None, num_fit: int
) -> tuple[int, ...]:
    """The sessions: as listed, else `parallel` of `context`, else auto: up to 16 that fit
    (`num_fit`), one when fewer than two do."""
    if slot_contexts is not None:
        if not slot_contexts:
            raise ValueError("slot_contexts lists no session")
        return tuple(slot_contexts)
    if parallel is not None:
        return (context,) * parallel
    return (context,) * max(1, min(MAX_AUTO_SESSIONS, num_fit))


def check_options(
    *,
    model_window: int,
    max_rows: int,
    mtp_drafts: int,
    drafts: bool = True,
    context: int | None = None,
    slot_contexts: Sequence[int] | None = None,
    parallel: int | None = None,
    slot_grow: int = 8192,
) -> None:
    """Refuse engine options that cannot hold together (OptionConflict names both)."""
    window = 1 + mtp_drafts if drafts else 1
    if parallel is not None and parallel < 1:
        raise OptionConflict(f"--parallel must be 1 or more, or auto; got {parallel}")
    if slot_contexts is not None and parallel is not None and parallel != len(slot_contexts):
        raise OptionConflict(
            f"--parallel {parallel} disagrees with --slot-contexts, which "
            f"lists {len(slot_contexts)} sessions"
        )
    if context is not None and context > model_window:
        raise OptionConflict(
            f"--context {context} is beyond the model's window of "
            f"{model_window} tokens (max_position_embeddings)"
        )
    for size in slot_contexts or ():
        if size > model_window:
            raise OptionConflict(
                f"--slot-contexts lists {size}, beyond the model's window of "
                f"{model_window} tokens (max_position_embeddings)"
            )
        if context is not None and size > context:
            raise OptionConflict(f"--slot-contexts lists {size}, above --context {context}")
    if slot_contexts:
        sizes = tuple(slot_contexts)
    else:
        sizes = (model_window if context is None else context,)
    drafts_note = f"1 + --mtp-drafts {mtp_drafts}" if drafts else "--no-drafts"
    if max_rows < window:
        raise OptionConflict(
            f"--max-rows {max_rows} is below one window of {window} rows ({drafts_note})"
        )
    source = "--slot-contexts" if slot_contexts else "--context"
    if min(sizes) < window:
        raise OptionConflict(
            f"{source} {min(sizes)} cannot hold one window of {window} rows ({drafts_note})"
        )
    # the grow margin only steers sized sessions (equal sessions never move)
    if slot_contexts and slot_grow > max(sizes):
        raise OptionConflict(
            f"--slot-grow {slot_grow} exceeds the largest session, {max(sizes)} tokens ({source})"
        )
