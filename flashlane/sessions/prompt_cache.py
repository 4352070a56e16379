"""The prompt cache's bookkeeping: marks, lookup of the longest kept prefix, eviction.

A hybrid model cannot truncate its recurrent state, so a prompt can only resume from a state
kept exactly at some position. States are kept at marks, positions on the GDN chunk grid:
floor(x / 64) * 64 for x = the prompt's length minus one (so a resent prompt re-runs at least
its last token, whose row draws the first reply token), for each chat message boundary, and for
every `every` tokens of a long prompt. A prompt's pieces are cut at its marks, so a resumed
prefill runs the same pieces from the mark on as a fresh one does.

No torch: entries are ids, prefixes and byte counts; the runner holds the tensors under the
entry's id. Eviction is least recently used, entries never resumed first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The GDN chunk size C: marks, and the prompt pieces the lane core cuts (lanes/records.py),
# start on this grid (DESIGN.md section 3).
CHUNK = 64
DEFAULT_EVERY = 4096  # a long prompt keeps a state every this many tokens


def prompt_marks(
    prompt_len: int, boundaries: Iterable[int] = (), every: int = DEFAULT_EVERY
) -> tuple[int, ...]:
    """The positions (ascending, each in 1..prompt_len-1, on the chunk grid) where a prompt of
    `prompt_len` tokens keeps its state. `boundaries`: token offsets where chat messages end."""
    if every <= 0 or every % CHUNK:
        raise ValueError(f"marks every {every} tokens: must be a positive multiple of {CHUNK}")
    xs = [prompt_len - 1, *boundaries, *range(every, prompt_len, every)]
    return tuple(sorted({x // CHUNK * CHUNK for x in xs if 0 < x // CHUNK * CHUNK < prompt_len}))


@dataclass(slots=True, eq=False)
class Entry:
    entry_id: int
    token_ids: tuple[int, ...]  # the kept prefix; its length is the mark
    nbytes: int  # what the runner holds for it
    has_drafts: bool  # the MTP head's state is kept too (a drafting stream may resume)
    num_resumes: int = 0
    last_used: int = 0  # the cache's clock at the entry's last use

    @property
    def length(self) -> int:
        return len(self.token_ids)


class PromptCache:
    """Kept prefixes under a byte budget; `lookup` finds the longest one a prompt extends."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = max(0, int(capacity_bytes))
        self.entries: dict[int, Entry] = {}
        self._by_key: dict[tuple[int, int], int] = {}  # (length, hash of the prefix) -> id
        self._next_id = 0
        self._clock = 0
        # plain counters, read from other threads (/metrics) while the engine runs
        self.num_bytes = 0
        self.num_queries = self.num_hits = self.num_hit_tokens = 0
        self.num_query_tokens = 0  # prompt tokens looked up (vLLM counts queries so)

    @property
    def is_enabled(self) -> bool:
        return self.capacity_bytes > 0

    def find(self, token_ids: Sequence[int], length: int) -> Entry | None:
        """The entry that keeps exactly token_ids[:length], if any (ids verified)."""
        prefix = tuple(token_ids[:length])
        entry_id = self._by_key.get((length, hash(prefix)))
        entry = self.entries.get(entry_id) if entry_id is not None else None
        return entry if entry is not None and entry.token_ids == prefix else None

    def lookup(self, prompt_ids: Sequence[int], need_drafts: bool) -> Entry | None:
        """The longest kept strict prefix of the prompt (counted as a query, and a hit)."""
        self.num_queries += 1
        self.num_query_tokens += len(prompt_ids)
        lengths = sorted({e.length for e in self.entries.values()}, reverse=True)
        for length in (n for n in lengths if n < len(prompt_ids)):
            entry = self.find(prompt_ids, length)
            if entry is not None and (entry.has_drafts or not need_drafts):
                self._clock += 1
                entry.num_resumes += 1
                entry.last_used = self._clock
                self.num_hits += 1
                self.num_hit_tokens += length
                return entry
        return None

    def make_room(self, nbytes: int) -> list[int] | None:
        """Evict until `nbytes` more fit; returns the evicted ids (the runner frees them), or
        None, evicting nothing, when the entry could never fit."""
        if nbytes > self.capacity_bytes:
            return None
        evicted = []
        order = sorted(self.entries.values(), key=lambda e: (e.num_resumes > 0, e.last_used))
        used = self.num_bytes
        for e in order:
            if used + nbytes <= self.capacity_bytes:
                break
            used -= e.nbytes
            self.drop(e.entry_id)
            evicted.append(e.entry_id)
        return evicted

    def reserve_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def add(self, entry_id: int, token_ids: Sequence[int], nbytes: int, has_drafts: bool) -> Entry:
        """Record an entry the runner now holds (room made first: see make_room)."""
        self._clock += 1
        entry = Entry(entry_id, tuple(token_ids), nbytes, has_drafts, last_used=self._clock)
        old = self.find(entry.token_ids, entry.length)
        if old is not None:
            self.drop(old.entry_id)
        self.entries[entry_id] = entry
        self.num_bytes += entry.nbytes
        self._by_key[(entry.length, hash(entry.token_ids))] = entry_id
        return entry

    def drop(self, entry_id: int) -> None:
        entry = self.entries.pop(entry_id, None)
        if entry is not None:
            self.num_bytes -= entry.nbytes
            key = (entry.length, hash(entry.token_ids))
            if self._by_key.get(key) == entry_id:
                del self._by_key[key]
