"""The memory plan's result (`MemoryPlan`) and its refusal (`OverMemoryLimit`), re-exported by
planning/memory.py, which makes them."""

from __future__ import annotations

from dataclasses import dataclass

from flashlane.planning.buffers import GIB
from flashlane.planning.limits import LIMIT_ENV

__all__ = ["REMEDIES", "MemoryPlan", "OverMemoryLimit"]

REMEDIES = (
    "a smaller --context, fewer sessions (--parallel), smaller --slot-contexts, "
    f"a smaller --prompt-cache-gb (0 turns it off), or a higher --memory-limit-gb ({LIMIT_ENV})"
)


class OverMemoryLimit(Exception):
    """A plan over the ceiling; the message says what needed how much, and the remedies."""

    def __init__(self, what: str, need_bytes: int, limit_bytes: int, remedies: str = REMEDIES):
        self.need_bytes, self.limit_bytes = need_bytes, limit_bytes
        super().__init__(
            f"{what} needs {need_bytes / GIB:.2f} GiB, over the {limit_bytes / GIB:.2f} GiB "
            f"available under the memory limit; remedies: {remedies}"
        )


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    device: str  # "cuda" | "cpu"
    limit_bytes: int  # the ceiling for weights + workspace + sessions on that device
    weight_bytes: int  # weights resident on the device
    scratch_bytes: int  # shared verify scratch: a GDN state and conv row per window row
    # max_rows x vocab fp32 logits + ACTIVATION_FIXED[device] + prompt_rows' activations
    activation_bytes: int
    capacities: tuple[int, ...]  # tokens of context, one per session
    # bytes of each session's buffers (on a GPU and its row of the lone driver's keyed-draw
    # buffers: planning/buffers.draw_row_bytes)
    session_bytes: tuple[int, ...]
    max_rows: int
    cache_bytes: int  # bytes per KV / conv element
    state_bytes: int  # bytes per recurrent-state element
    auto: bool  # --parallel auto chose the number of sessions
    serial: bool  # fewer than two sessions fit: one reply at a time
    host_bytes: int = 0  # host memory for a GPU model's n-gram table
    host_limit_bytes: int | None = None  # its ceiling (70% of RAM)
    host_dtype: str = "bf16"  # the table's values there: bf16, or int8 with a per-row scale
    prompt_rows: int = 0  # the longest prompt piece of a round
    prompt_cache_bytes: int = 0  # the prompt cache's budget (kept states), under the limit
    kv_fp8: bool = False  # K, V, indexer keys in e4m3 + fp32 scales (fp8, or auto: FP8 weights)
    shorter: tuple[tuple[int, int], ...] = ()  # serial: (a --context, its sessions)
    draw_row_bytes: int = 0  # of each session's bytes, its row of the keyed draws' buffers

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
