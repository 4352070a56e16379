"""Which kind of rows a forward runs, for the kernels whose bits may follow it.

DESIGN.md section 1 asks that a row's bits not depend on the rows beside it. A prompt row is a
prompt row in every run of its request (alone, batched, cut into other pieces, resumed from a
prompt cache mark: sessions/prompt_cache.py keeps states only at marks inside a prompt), and a
decode row (a verify window's, a lone or drafted step's) is a decode row in every run. So a
kernel may give the two kinds different bits, as long as every row of one kind gets the same
bits whatever else runs. The block-FP8 GEMMs use this: prompt rows run on wgmma tiles
(`kernels/linear/triton_fp8.py`, `kernels/moe/triton_fp8.py`), whose per-block dot from zero
differs from the decode tiles' mma.sync in a few elements of 10^5, and which mma.sync's 32-row
tiles held to 10% of the e4m3 matrix rate.
The indexer's scores (kernels/attention/triton_scores.py) split the same way, told by their
callers: decode rows (a verify window's in a round, every row of `attend_sessions`) in dots
of 64 block keys by up to 16 query rows, prompt rows in dots of 64 query rows by 64 keys.

The runner says what a forward's rows are (`runner/backend.py`'s verify: the decode windows
first, then the prompt pieces): `rows(prompt_from, total)`. Outside it every row is a decode
row. A kernel asks `split(m)` for a call of m rows: the runs of one kind, in row order.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

__all__ = ["is_mixed", "key", "rows", "split", "uniform"]

# (prompt_from, total): rows [0, prompt_from) decode, [prompt_from, total) prompt; None: all
# decode. A thread's own: the engine's forward and a server thread's prompt logprobs
# (server/engine_thread.py) may run at once.
_STATE: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
    "row_kind", default=None
)


@contextlib.contextmanager
def _set(state: tuple[int, int] | None) -> Iterator[None]:
    token = _STATE.set(state)
    try:
        yield
    finally:
        _STATE.reset(token)


def rows(prompt_from: int, total: int) -> contextlib.AbstractContextManager:
    """A forward of `total` rows whose rows from `prompt_from` on are prompt rows."""
    if not 0 <= prompt_from <= total:
        raise ValueError(f"prompt rows from {prompt_from} of {total}")
    return _set(None if prompt_from == total else (prompt_from, total))


def uniform(prompt: bool) -> contextlib.AbstractContextManager:
    """Rows of one kind: a call inside a mixed forward that runs one run of `split`, or a
    forward of prompt rows outside the backend."""
    return _set((0, 0) if prompt else None)


def is_mixed() -> bool:
    """Whether the forward now running has rows of both kinds."""
    state = _STATE.get()
    return state is not None and 0 < state[0] < state[1]


def key() -> tuple:
    """What a replayed part's graph is captured for (runner/graphs.py): the rows' kind."""
    return ("prompt",) if _STATE.get() is not None else ()


def split(m: int) -> list[tuple[int, int, bool]]:
    """A call of m rows as runs (start, end, prompt) of one kind each. In a mixed forward
    only a call of the forward's rows can be split; another count is an error, since its
    rows' kinds are unknown."""
    state = _STATE.get()
    if state is None:
        return [(0, m, False)]
    prompt_from, total = state
    if prompt_from == 0 or total == 0:
        return [(0, m, True)]
    if m != total:
        raise ValueError(
            f"a call of {m} rows in a forward of {total} whose rows from {prompt_from} are "
            "prompt rows: its rows' kinds are unknown"
        )
    return [(0, prompt_from, False), (prompt_from, m, True)]
