"""Incremental detokenisation and stop strings, shared by the engine host and the server.

Both work on text that grows a few tokens at a time and decide how much of it is final:
`IncrementalDetokenizer` holds back bytes that do not yet form a whole UTF-8 character, and
`StopMatcher` holds back text that may be the start of a stop string.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol

# What byte-level BPE decoding yields for bytes that are not (yet) a whole character.
REPLACEMENT = "\ufffd"


class Decoder(Protocol):
    """The part of `tokenizers.Tokenizer` that detokenisation needs."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Decodes a growing list of token ids into text, never emitting half a character.

    Decoding the last few tokens alone can differ from decoding them in context (a byte-level
    token may hold the tail of a character started by the token before), so each step decodes
    a short window that starts at a token boundary already known to sit between characters
    (`_prefix`) and emits what lies past the text already emitted (`_read`).
    """

    def __init__(self, tokenizer: Decoder, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self.token_ids: list[int] = []
        self.text = ""
        # token_ids[_prefix:_read] decodes to the tail of `text` that the window starts with
        self._prefix = 0
        self._read = 0

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def add(self, token_ids: Iterable[int]) -> str:
        """Appends tokens; returns the newly final text (possibly empty)."""
        self.token_ids.extend(token_ids)
        if len(self.token_ids) == self._read:
            return ""
        known = self._decode(self.token_ids[self._prefix : self._read])
        window = self._decode(self.token_ids[self._prefix :])
        if len(window) <= len(known) or window.endswith(REPLACEMENT):
            return ""
        new = window[len(known) :]
        self._prefix, self._read = self._read, len(self.token_ids)
        self.text += new
        return new

    def flush(self) -> str:
        """Emits whatever is held back (as U+FFFD where bytes never completed a character)."""
        if len(self.token_ids) == self._read:
            return ""
        known = self._decode(self.token_ids[self._prefix : self._read])
        new = self._decode(self.token_ids[self._prefix :])[len(known) :]
        self._prefix = self._read = len(self.token_ids)
        self.text += new
        return new


class StopCheck(NamedTuple):
    """How much of a text may be shown, given the stop strings."""

    visible: int  # text[:visible] is final: it neither holds nor may begin a stop string
    stop: str | None  # the stop string found (the text is cut where it starts), else None


class StopMatcher:
    """Finds stop strings in a growing text; the stop string itself is never part of the output.

    Feed it the whole text so far after each step; it only searches the part that could hold a
    stop string that was not there before.
    """

    def __init__(self, stop: Sequence[str] | str | None = None) -> None:
        if isinstance(stop, str):
            stop = [stop]
        self.stop = tuple(s for s in (stop or ()) if s)
        self._longest = max((len(s) for s in self.stop), default=0)
        self._searched = 0  # no stop string starts before this index of the text

    def check(self, text: str) -> StopCheck:
        """Returns the final prefix of `text` and the stop string that ended it, if any."""
        if not self.stop:
            return StopCheck(len(text), None)
        start = self._searched
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = text.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            return StopCheck(best[0], best[1])
        # a stop string that starts before `visible` would already be whole in the text
        visible = len(text) - self._held(text)
        self._searched = visible
        return StopCheck(visible, None)

    def _held(self, text: str) -> int:
        """The length of the longest tail of `text` that is a proper prefix of a stop string."""
        for n in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0
