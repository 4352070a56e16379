"""The prompt cache applied to streams: resume at admission, keep states at marks.

The bookkeeping is `flashlane.sessions.prompt_cache`'s; the states are the backend's, under the
entry ids. A failure here never ends a stream: a resume that fails leaves the stream to prefill
from zero, a keep that fails keeps nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from flashlane.lanes.protocol import Backend
from flashlane.lanes.stream import Stream
from flashlane.sessions.prompt_cache import PromptCache

log = logging.getLogger(__name__)


def resume(cache: PromptCache, backend: Backend, s: Stream, need_drafts: bool) -> None:
    """Start an admitted stream (its session chosen, no window run) from the longest kept
    prefix of its prompt, if any: it then prefills only the rest."""
    if not cache.is_enabled:
        return
    entry = cache.lookup(s.prompt_ids, need_drafts)
    if entry is None:
        return
    try:
        length = backend.resume(s.stream_id, s.session_id, entry.entry_id)
    except Exception:  # the stream prefills from zero instead
        log.exception("resuming stream %d from entry %d failed", s.stream_id, entry.entry_id)
        cache.drop(entry.entry_id)
        backend.drop_state(entry.entry_id)
        backend.release(s.stream_id, False)
        return
    s.filled = s.num_cached = length


def keep_marks(cache: PromptCache, backend: Backend, streams: Sequence[Stream]) -> None:
    """After a round: keep the state of every filling stream that now stands at one of its
    marks, unless that prefix is kept already."""
    if not cache.is_enabled:
        return
    for s in streams:
        if s.is_finished or not s.is_filling or s.filled not in s.marks:
            continue
        if cache.find(s.prompt_ids, s.filled) is not None:
            continue
        try:
            evicted = cache.make_room(backend.kept_bytes(s.stream_id))
            if evicted is None:
                continue
            for entry_id in evicted:
                backend.drop_state(entry_id)
            entry_id = cache.reserve_id()
            nbytes, has_drafts = backend.keep_state(s.stream_id, entry_id)
        except Exception:  # keeping is an optimisation: the stream goes on without it
            log.exception("keeping the state of stream %d at %d failed", s.stream_id, s.filled)
            continue
        cache.add(entry_id, s.prompt_ids[: s.filled], nbytes, has_drafts)
        evicted = cache.make_room(0) or []  # the estimate may have been short
        for old in evicted:
            backend.drop_state(old)
