"""check_options: refuse engine options that cannot hold together, before any memory is planned."""

from __future__ import annotations

from collections.abc import Sequence


class OptionConflict(ValueError):
    """Two options that cannot hold together; the message names both."""


def check_options(
    *,
    model_window: int,
    max_rows: int,
    mtp_drafts: int,
    drafts: bool = True,
    context: int | None = None,
    slot_contexts: Sequence[int] | None = None,
    parallel: int | None = None,
    slot_grow: int | None = None,
) -> None:
    """Refuse engine options that cannot hold together (OptionConflict names both).
    `slot_grow` None: the default margin, which is only checked when the user sets it."""
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
    if slot_contexts and slot_grow is not None and slot_grow > max(sizes):
        raise OptionConflict(
            f"--slot-grow {slot_grow} exceeds the largest session, {max(sizes)} tokens ({source})"
        )
