"""The memory plan: sessions under the ceiling beside the weights, workspace and prompt cache,
`--parallel auto`.

No torch. What each part takes is in `planning/buffers.py`, the ceiling and the prompt cache's
budget in `planning/limits.py`, the options predicate in `planning/options.py`; their public
names are re-exported here. All sizes are GiB (2**30 bytes), whatever a flag says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from flashlane.models.config import ModelConfig
from flashlane.planning.buffers import (
    ACTIVATION_FIXED,
    ELEMENT_BYTES,
    GIB,
    MIB,
    MIN_PREFILL_ROWS,
    PREFILL_ROWS,
    Buffer,
    activation_bytes,
    draw_row_bytes,
    element_bytes,
    scratch_buffers,
    session_buffers,
    session_bytes,
    weight_bytes,
)
from flashlane.planning.limits import (
    GPU_FRACTION,
    GPU_RESERVE_GB,
    LIMIT_ENV,
    PROMPT_CACHE_GB,
    PROMPT_CACHE_ROOM,
    PROMPT_CACHE_SHARE,
    RAM_FRACTION,
    default_gpu_limit,
    parse_limit_gb,
    read_ram_bytes,
    resolve_limit_bytes,
    resolve_prompt_cache_bytes,
)
from flashlane.planning.options import OptionConflict, check_options
from flashlane.planning.plan import REMEDIES, MemoryPlan, OverMemoryLimit
from flashlane.sessions.slots import format_slot_contexts

__all__ = [
    "ACTIVATION_FIXED",
    "ELEMENT_BYTES",
    "GIB",
    "GPU_FRACTION",
    "GPU_RESERVE_GB",
    "LIMIT_ENV",
    "MAX_AUTO_SESSIONS",
    "MAX_AUTO_SESSIONS_GPU",
    "MIB",
    "MIN_PREFILL_ROWS",
    "PREFILL_ROWS",
    "PROMPT_CACHE_GB",
    "PROMPT_CACHE_ROOM",
    "PROMPT_CACHE_SHARE",
    "RAM_FRACTION",
    "REMEDIES",
    "Buffer",
    "MemoryPlan",
    "OptionConflict",
    "OverMemoryLimit",
    "activation_bytes",
    "check_options",
    "default_gpu_limit",
    "element_bytes",
    "kv_fp8_planned",
    "parse_limit_gb",
    "plan",
    "plan_fitting",
    "prompt_rows_that_fit",
    "read_ram_bytes",
    "resolve_limit_bytes",
    "resolve_prompt_cache_bytes",
    "scratch_buffers",
    "session_buffers",
    "session_bytes",
    "weight_bytes",
]

MAX_AUTO_SESSIONS = 16  # the CPU's: its rounds gain little past 16 streams
# a GPU's: the lone driver's step graphs take any number of sessions (issue 28: at least 256)
MAX_AUTO_SESSIONS_GPU = 256
# sessions auto: below this many, shorter prompt pieces are worth the sessions they make room
# for (the real Flash Next in FP8 on an H200: 3 sessions of 32k with pieces of 2,048, 1 with
# 8,192)
AUTO_SESSIONS_WANTED = 16


def kv_fp8_planned(asked: str | None, fp8_weights: bool, device: str) -> bool:
    """Whether --kv-cache-dtype `asked` keeps the attention caches in 8 bits: fp8, or auto
    (None) with block-FP8 weights on cuda (the engine also asks the GPU to convert e4m3:
    engine_plan.auto_kv_fp8)."""
    auto = asked in (None, "auto") and fp8_weights and device.startswith("cuda")
    return asked == "fp8" or auto


def plan(
    cfg: ModelConfig,
    *,
    max_rows: int,
    window_rows: int = 0,
    slot_contexts: Sequence[int] | None = None,
    parallel: int | None = None,
    **options,
) -> MemoryPlan:
    """_plan() with `max_rows` decode rows a round, or with window_rows > 0 (--max-rows
    unset; the widest window a stream verifies) no more rows than the sessions can fill:
    min(max_rows, sessions x window_rows). Sessions auto: where fewer sessions fit than
    max_rows would serve, the most that fit beside their own rows; and where that is fewer
    than AUTO_SESSIONS_WANTED, narrower windows (`narrower`: rows a session, halved down to
    one) while they make room for more sessions: sessions before drafts' rows (the real
    Flash Next in FP8 on an H200 with 8-bit caches, sessions of 32,768: 6 beside windows of
    9 rows, 16 beside a row each, which rounds share among the streams that draft)."""
    if window_rows <= 0:
        return _plan(cfg, max_rows=max_rows, slot_contexts=slot_contexts, parallel=parallel,
                     **options)  # fmt: skip
    if slot_contexts is not None or parallel is not None:
        n = len(slot_contexts) if slot_contexts is not None else parallel
        rows = min(max_rows, max(1, n * window_rows))
        return _plan(cfg, max_rows=rows, slot_contexts=slot_contexts, parallel=parallel,
                     **options)  # fmt: skip
    best, refused = None, None
    for width in narrower(window_rows):
        try:
            got = _auto_rows(cfg, max_rows, width, **options)
        except OverMemoryLimit as err:
            refused = refused or err
            continue
        if best is None or got.num_sessions > best.num_sessions:
            best = got
        if best.num_sessions >= AUTO_SESSIONS_WANTED:
            break
    if best is None:
        raise refused
    return best


def narrower(window_rows: int) -> list[int]:
    """The windows a plan tries, widest first: window_rows halved (rounded up) down to 1."""
    widths = [window_rows]
    while widths[-1] > 1:
        widths.append(-(-widths[-1] // 2))
    return widths


def _auto_rows(cfg: ModelConfig, max_rows: int, window_rows: int, **options) -> MemoryPlan:
    """Auto sessions beside max_rows rows, or, where they would fill fewer rows, the most
    sessions that fit beside window_rows rows each."""
    try:
        full = _plan(cfg, max_rows=max_rows, **options)
    except OverMemoryLimit as err:
        full, refused = None, err
    if full is not None and full.num_sessions * window_rows >= max_rows:
        return full
    best = full
    most = MAX_AUTO_SESSIONS_GPU if options["device"].startswith("cuda") else MAX_AUTO_SESSIONS
    # n sessions that fill fewer than max_rows, no more than auto takes on the device
    for n in range(1, min(-(-max_rows // window_rows), most + 1)):
        try:
            fits = _plan(cfg, max_rows=n * window_rows, parallel=n, **options)
        except OverMemoryLimit as err:
            refused = err
            break
        if best is None or fits.num_sessions >= best.num_sessions:
            best = dataclasses.replace(fits, auto=True, serial=n < 2)
    if best is None:
        raise refused
    return best


def _plan(
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
    prompt_rows: int = 0,
    host_dtype: str = "bf16",
    kv_fp8: bool = False,
    prompt_cache_auto: bool = False,
) -> MemoryPlan:
    """Sessions under the ceiling: `slot_contexts` as listed, else `parallel` sessions of
    `context` (default: the model's window), else (`parallel=None`, auto) as many as fit up to
    16 (256 on a GPU), one session when fewer than two fit; the prompt cache's budget is
    planned beside the weights and workspace; `prompt_rows`, the longest prompt piece of a
    round, adds its activations to the workspace; kv_fp8: the attention caches in 8 bits
    (buffers.session_buffers); prompt_cache_auto (no --prompt-cache-gb): the cache takes at
    most a quarter of what the weights, the workspace and the sessions leave (those listed
    or asked; auto: as many as fit up to AUTO_SESSIONS_WANTED), the sessions the rest.
    Raises OverMemoryLimit."""
    cache_b, state_b = element_bytes(device)
    scratch = sum(b.nbytes for b in scratch_buffers(cfg, max_rows, cache_b, state_b))
    longest = max([context or cfg.max_position_embeddings, *(slot_contexts or [])])
    activations = activation_bytes(cfg, max_rows, device, prompt_rows, longest)
    context = cfg.max_position_embeddings if context is None else context
    draw = draw_row_bytes(cfg, device)  # each session's row of the keyed draws' buffers

    def sized(capacity: int) -> int:
        return session_bytes(cfg, capacity, cache_b, state_b, mtp, kv_fp8) + draw

    one = sized(context)
    if prompt_cache_auto:  # a quarter at most of what is left beside the sessions
        room = limit_bytes - weight_bytes - scratch - activations
        if slot_contexts:
            room -= sum(sized(c) for c in slot_contexts)
        else:  # the sessions asked, or those that fit up to AUTO_SESSIONS_WANTED (at least 1)
            room -= one * (parallel or min(AUTO_SESSIONS_WANTED, max(1, room // one)))
        prompt_cache_bytes = min(prompt_cache_bytes, max(0, room // PROMPT_CACHE_ROOM))
    fixed = weight_bytes + scratch + activations + prompt_cache_bytes
    if fixed > limit_bytes:
        what = "the weights, the round's workspace and the prompt cache"
        raise OverMemoryLimit(what, fixed, limit_bytes)
    if host_limit_bytes is not None and host_bytes > host_limit_bytes:
        eight = "" if host_dtype == "int8" else "the table in 8 bits (--ple-table-dtype int8), "
        raise OverMemoryLimit(
            "the n-gram table in host memory",
            host_bytes,
            host_limit_bytes,
            f"a machine with more RAM (the host's ceiling is {RAM_FRACTION:.0%} of it), "
            f"{eight}or the table on the GPU (--ple-table-device cuda) if the GPU holds it",
        )
    budget = limit_bytes - fixed
    most = MAX_AUTO_SESSIONS_GPU if device.startswith("cuda") else MAX_AUTO_SESSIONS
    capacities = _capacities(context, slot_contexts, parallel, min(most, budget // one))
    sizes = {c: sized(c) for c in set(capacities)}
    per_session = tuple(sizes[c] for c in capacities)
    if sum(per_session) > budget:
        what = f"{len(capacities)} session(s) of {format_slot_contexts(capacities)} tokens"
        raise OverMemoryLimit(what, sum(per_session), budget)
    return MemoryPlan(
        device=device,
        limit_bytes=limit_bytes,
        weight_bytes=weight_bytes,
        scratch_bytes=scratch,
        activation_bytes=activations,
        capacities=capacities,
        session_bytes=per_session,
        max_rows=max_rows,
        cache_bytes=cache_b,
        state_bytes=state_b,
        auto=slot_contexts is None and parallel is None,
        serial=len(capacities) < 2,
        host_bytes=host_bytes,
        host_limit_bytes=host_limit_bytes,
        host_dtype=host_dtype,
        prompt_rows=prompt_rows,
        prompt_cache_bytes=prompt_cache_bytes,
        kv_fp8=kv_fp8,
        draw_row_bytes=draw,
    )


def prompt_rows_that_fit(plan: MemoryPlan, cfg: ModelConfig, started_bytes: int) -> int:
    """The plan's prompt pieces, halved (not below MIN_PREFILL_ROWS) until their activations
    fit in what the engine's start left under the limit. `started_bytes` is measured once the
    weights, sessions and CUDA graphs' pools are in place: the pools, which the plan's fixed
    allowance stood for (2.0 GiB for the full-size FP8 model on an H200, past its 1), are in
    it, so a quarter of that allowance stays for the decode rows' transients, beside the
    logits, the rounds' scratch and the prompt cache's budget."""
    longest, device = max(plan.capacities), plan.device
    room = plan.limit_bytes - started_bytes - plan.scratch_bytes - plan.prompt_cache_bytes
    room += ACTIVATION_FIXED[device] * 3 // 4  # the graphs' share, measured in started_bytes
    rows = plan.prompt_rows
    while (
        rows // 2 >= _piece_floor(device)
        and activation_bytes(cfg, plan.max_rows, device, rows, longest) > room
    ):
        rows //= 2
    return rows


def _piece_floor(device: str) -> int:
    """The shortest prompt piece a plan halves down to on this device."""
    return MIN_PREFILL_ROWS["cuda" if device.startswith("cuda") else "cpu"]


def plan_fitting(cfg: ModelConfig, *, device: str, prompt_rows: int, **options) -> MemoryPlan:
    """plan() with prompt pieces of `prompt_rows`, halved down to MIN_PREFILL_ROWS where the
    plan would not fit, or (sessions auto, fewer than AUTO_SESSIONS_WANTED) where shorter
    pieces make room for more sessions: smaller pieces before fewer sessions; the plan's
    prompt_rows says which. Raises the smallest pieces' OverMemoryLimit."""
    floor = _piece_floor(device)
    best = None
    while True:
        try:
            got = plan(cfg, device=device, prompt_rows=prompt_rows, **options)
        except OverMemoryLimit as err:
            if best is None and prompt_rows // 2 < floor:
                err.args = (f"{err} (prompt pieces of {prompt_rows} rows)",)
                raise
        else:
            if best is None or got.num_sessions > best.num_sessions:
                best = got
            if not got.auto or got.num_sessions >= AUTO_SESSIONS_WANTED:
                return best
        if prompt_rows // 2 < floor:
            return best
        prompt_rows //= 2


def _capacities(
    context: int, slot_contexts: Sequence[int] | None, parallel: int | None, num_fit: int
) -> tuple[int, ...]:
    """The sessions: as listed, else `parallel` of `context`, else auto: up to 16 that fit
    (`num_fit`, which the caller may cap higher), one when fewer than two do."""
    if slot_contexts is not None:
        if not slot_contexts:
            raise ValueError("slot_contexts lists no session")
        return tuple(slot_contexts)
    if parallel is not None:
        return (context,) * parallel
    return (context,) * max(1, num_fit)
