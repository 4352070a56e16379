"""Token logprobs in the two OpenAI shapes: chat's `content` list and completions' columns."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers import Tokenizer

from flashlane.server.engine_api import TokenLogprobs


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character that stands for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class TokenText:
    """Strings and bytes of single tokens, for logprobs."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token_id: int) -> tuple[str, list[int]]:
        found = self._cache.get(token_id)
        if found is None and self._tokenizer is None:
            return f"token_id:{token_id}", []
        if found is None:
            text = self._tokenizer.decode([token_id], skip_special_tokens=False)
            piece = self._tokenizer.id_to_token(token_id) or ""
            table = _byte_decoder()
            if piece and all(c in table for c in piece):
                raw = [table[c] for c in piece]
            else:
                raw = list(text.encode())
            found = self._cache[token_id] = (text, raw)
        return found


# JSON has no -inf; OpenAI writes this for impossible tokens.
_FLOOR = -9999.0


def _finite(logprob: float | None) -> float:
    return _FLOOR if logprob is None or not logprob >= _FLOOR else logprob


def _ranked(entry: TokenLogprobs, top: int) -> list[tuple[int, float]]:
    ranked = sorted(entry.items(), key=lambda kv: (-kv[1], kv[0]))[:top]
    return [(i, _finite(lp)) for i, lp in ranked]


def chat_logprobs(
    names: TokenText, token_ids: list[int], entries: list[TokenLogprobs], top: int
) -> list[dict[str, Any]]:
    """chat's logprobs.content: one item per token with its `top` alternatives."""
    out = []
    for token_id, entry in zip(token_ids, entries):
        text, raw = names.get(token_id)
        alternatives = []
        for alt_id, logprob in _ranked(entry, top):
            alt_text, alt_raw = names.get(alt_id)
            alternatives.append({"token": alt_text, "logprob": logprob, "bytes": alt_raw})
        logprob = _finite(entry.get(token_id))
        out.append({"token": text, "logprob": logprob, "bytes": raw, "top_logprobs": alternatives})
    return out


def completion_logprobs(
    names: TokenText,
    token_ids: list[int],
    entries: list[TokenLogprobs | None],
    top: int,
    offset: int = 0,
) -> dict[str, list[Any]]:
    """completions' logprobs columns; `offset` is where the tokens' text starts in the choice."""
    tokens, token_logprobs, tops, offsets = [], [], [], []
    for token_id, entry in zip(token_ids, entries):
        text, _ = names.get(token_id)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_logprobs.append(None)
            tops.append(None)
            continue
        token_logprobs.append(_finite(entry.get(token_id)))
        tops.append({names.get(i)[0]: lp for i, lp in _ranked(entry, top)} if top else None)
    return {
        "tokens": tokens,
        "token_logprobs": token_logprobs,
        "top_logprobs": tops,
        "text_offset": offsets,
    }


def merge_columns(a: dict[str, list[Any]], b: dict[str, list[Any]]) -> dict[str, list[Any]]:
    return {key: a[key] + b[key] for key in a}
