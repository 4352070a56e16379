"""Constrained decoding: a stream's grammar state and the mask of each row it draws.

The engine is llguidance (MIT, Rust with abi3 wheels): it runs on the CPU with no torch of its
own (xgrammar requires torch, and pip could pull a second, CUDA build of it; outlines-core
builds a regex index per schema up front, seconds for large schemas), computes a mask in tens
of microseconds over a 150k vocabulary without a per-grammar precompile, takes JSON schema,
regex and Lark (with `%json{...}` inside, which the tool-call grammars use), and can roll back
consumed tokens. vLLM and llama.cpp use it for the same job.

Exactness (DESIGN.md section 5): a masked id's logit is -inf before the keyed draw, so it is
never a candidate, and the mask of a row depends only on the stream's own tokens before it. A
decode window's row r draws after the reply so far and its tokens 1..r (drafts or forced), so
its mask is the grammar's state after those tokens: `row_masks` consumes the window's tokens
one by one, masks after each, and rolls them all back, so a rejected draft leaves nothing in
the grammar; the kept tokens come back as the reply grows (`sync`). Rows after a draft the
grammar refuses are never kept (the row before cannot draw the refused token), so they reuse
the last mask only to stay drawable.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from flashlane.request import StructuredOutput

# JSON as json.dumps writes it by default: one space after ',' and ':', no other whitespace, so
# a reply cannot pad forever with spaces or newlines. A schema's "x-guidance" may override it.
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar that does not compile, or a stream whose tokens its grammar refuses."""


def grammar_text(structured: StructuredOutput) -> str:
    """The llguidance grammar for a constraint (not yet checked)."""
    import llguidance

    m = llguidance.LLMatcher
    if structured.json is not None:
        try:
            schema = json.loads(structured.json)
        except json.JSONDecodeError as e:
            raise GrammarError(f"the JSON schema is not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise GrammarError("the JSON schema must be an object")
        try:
            return m.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
        except ValueError as e:
            raise GrammarError(f"the JSON schema is not valid: {e}") from None
    if structured.regex is not None:
        return m.grammar_from_regex(structured.regex)
    if structured.choice is not None:
        options = " | ".join(json.dumps(c) for c in structured.choice)
        return m.grammar_from_lark(f"start: {options}")
    assert structured.grammar is not None
    return m.grammar_from_lark(structured.grammar)


def check(structured: StructuredOutput) -> None:
    """Raises GrammarError naming the problem if the constraint does not compile."""
    import llguidance

    text = grammar_text(structured)
    error = llguidance.LLMatcher.validate_grammar(text, None)
    if error:
        raise GrammarError(f"the structured output does not compile: {error.strip()}")


class Grammars:
    """The tokenizer's view for grammars, built on first use (a few hundred ms for a large
    vocabulary), and the matchers made from it."""

    def __init__(self, tokenizer_json: str, vocab_size: int, eos_ids: Sequence[int]) -> None:
        self._source = tokenizer_json
        self.vocab_size = vocab_size  # the model's logits width (may exceed the tokenizer's)
        self.eos_ids = sorted(eos_ids)
        self._tokenizer = None

    def matcher(self, structured: StructuredOutput) -> StreamGrammar:
        import llguidance

        if self._tokenizer is None:
            self._tokenizer = llguidance.LLTokenizer(
                self._source, n_vocab=self.vocab_size, eos_token=self.eos_ids
            )
        m = llguidance.LLMatcher(self._tokenizer, grammar_text(structured), log_level=0)
        if m.is_error():
            raise GrammarError(f"the structured output does not compile: {m.get_error()}")
        return StreamGrammar(m, self.vocab_size)


class StreamGrammar:
    """One stream's grammar state: it has consumed the first `num_consumed` reply tokens."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.num_consumed = 0
        self._words = (vocab_size + 31) // 32

    def sync(self, reply_ids: Sequence[int]) -> None:
        """Consume the reply tokens kept since the last call."""
        new = [int(t) for t in reply_ids[self.num_consumed :]]
        if new and self.matcher.try_consume_tokens(new) != len(new):
            why = self.matcher.get_error() or "a token it refuses"
            raise GrammarError(f"the reply left its grammar ({why})")
        self.num_consumed = len(reply_ids)

    def row_masks(self, reply_ids: Sequence[int], tokens: Sequence[int]) -> np.ndarray:
        """Allowed ids bool [len(tokens), V] for a window's rows: row r after the reply and
        tokens[1 : r + 1] (row 0 is the pending token, already the reply's last). The
        grammar's state afterwards is the reply's, whatever the window's tokens were."""
        self.sync(reply_ids)
        n = len(tokens)
        bits = np.zeros((n, self._words), dtype=np.int32)
        consumed = 0
        for r in range(n):
            if r > 0 and consumed == r - 1:
                consumed += self.matcher.try_consume_tokens([int(tokens[r])])
            if consumed == r:
                self.matcher.unsafe_compute_mask_ptr(bits[r].ctypes.data, bits[r].nbytes)
            else:  # after a refused draft: never kept, drawable only
                bits[r] = bits[consumed]
        if consumed:
            self.matcher.rollback(consumed)
        allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")
        allowed = allowed[:, : self.vocab_size].astype(bool)
        if not allowed[0].any():
            raise GrammarError("the grammar allows no further token")
        return allowed
