"""When one session fills the plan: what shorter sessions would serve at once.

With --context unset every session holds the model's window (DESIGN.md section 6), so a model
that fills the GPU can leave room for one session only, and the engine then serves one reply at
a time (the real Flash Next in FP8 on an H200: one session of 262,144). vLLM prints the
concurrency a length allows; here the plan says which --context would give more sessions,
planned with the same options, so the remedy is a number, not a guess.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from flashlane.planning.memory import MemoryPlan, OverMemoryLimit
from flashlane.planning.options import OptionConflict

CONTEXTS = (131_072, 65_536, 32_768, 16_384, 8_192)  # the lengths tried, longest first


def with_shorter(plan: MemoryPlan, plan_at: Callable[[int], MemoryPlan], sized: bool) -> MemoryPlan:
    """`plan`, and where it is serial and nothing sized its sessions (no --context,
    --slot-contexts or --parallel: `sized` False), the sessions `plan_at(context)` plans at
    each shorter CONTEXTS length that fits two or more (MemoryPlan.shorter)."""
    if not plan.serial or sized:
        return plan
    found = []
    for context in CONTEXTS:
        if context >= max(plan.capacities, default=0):
            continue
        try:
            n = plan_at(context).num_sessions
        except (OverMemoryLimit, OptionConflict):  # a hint: never why a start fails
            continue
        if n >= 2:
            found.append((context, n))
    return dataclasses.replace(plan, shorter=tuple(found))


def shorter_note(plan: MemoryPlan) -> str | None:
    """The start-up summary's line, or None."""
    return None if not plan.shorter else f"one reply at a time: {shorter_contexts(plan)}"


def shorter_contexts(plan: MemoryPlan) -> str:
    """The shorter contexts as `flashlane info` lists them (plan.shorter not empty):
    "--context 65536 gives 2 sessions, 32768 gives 5"."""
    (first, n), *rest = plan.shorter
    more = "".join(f", {c} gives {k}" for c, k in rest)
    return f"--context {first} gives {n} sessions{more}"
